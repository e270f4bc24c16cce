"""Conneau et al. 2020 on the Bible: Table 1's rows (runs), the recipe that trains and evaluates them, the report."""
