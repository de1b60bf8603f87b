"""One training recipe per draft kind (``outpace train draft --method ...``)."""
