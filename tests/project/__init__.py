"""Project-wide tests: the layering and conventions, the docs, the notebook, the suite itself, the specscope command."""
