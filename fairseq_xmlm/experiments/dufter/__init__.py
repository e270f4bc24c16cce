"""Dufter & Schütze 2020 on Fake-English: Tables 1 and 2 and Figures 4-8 (runs, the recipe that trains and
evaluates them, the GPU sweep that trains them as stacked models, the report)."""
