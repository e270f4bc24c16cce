"""Dufter & Schütze 2020, Table 4 on the Bible: word order distance to English (Match alignments, Kendall's tau)
against zero-shot transfer of a multilingual model (runs, the recipe, the report)."""
