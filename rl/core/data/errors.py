"""The one error type raised for bad prompt data, so callers can catch input problems apart from bugs."""


class DataError(ValueError):
    """Input data at fault: the message names the file (and row or key) and says how to fix it."""
