"""`perfdoctor tune`: measured what-if trials of zero-code changes on the unmodified script."""
