"""The one error type users see: it names the field, the value and what is allowed."""


class InputError(ValueError):
    """Bad user input. ``str(err)`` is one line: ``field=value: allowed``."""

    def __init__(self, field: str, value, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r}: {allowed}")
