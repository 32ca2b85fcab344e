"""The `cxr-vqa` application: the command line, the demo and `evaluate`, above the dataset packages.

`builders/` is the machinery every dataset shares and knows no dataset; `gemex_dataset/` and
`rexvqa_dataset/` stand on it and not on each other; this package is the one place that
names both.
"""
