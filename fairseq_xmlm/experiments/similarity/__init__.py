"""Conneau et al. 2020, Section 5: how similar independently trained monolingual MLMs are (word translation,
sentence retrieval, linear CKA), on the Bible."""
