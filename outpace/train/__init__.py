"""Training utilities: source corpus, tokenizer, toy targets and drafts."""
