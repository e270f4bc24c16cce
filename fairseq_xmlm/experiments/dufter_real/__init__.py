"""Dufter & Schütze 2020 on real languages: Table 3 (English, German, Hindi) on the Bible (runs, the recipe that
trains and evaluates them, one run's evaluation, the report)."""
