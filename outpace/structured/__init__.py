"""Structured output: grammar-constrained decoding (JSON schemas, regexes, choices, EBNF) through xgrammar."""

from outpace.structured.grammar import ConstraintError, GrammarCompiler, RequestGrammar
from outpace.structured.table import GrammarTable

__all__ = ["ConstraintError", "GrammarCompiler", "RequestGrammar", "GrammarTable"]
