"""The text pipeline around a search: a request cut into lines and sentences (``sentences.py``), long sentences into
clauses (``clauses.py``), and put back together. The service, the CLI and the browser folder share these rules."""
