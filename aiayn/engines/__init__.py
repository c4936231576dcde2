"""Step engines: everything that implements the search's step interface (``aiayn.search.StepModel``)."""

DEVICES = ("auto", "cpu", "cuda")  # where an engine runs; auto: a GPU where one really works
