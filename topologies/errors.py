"""The one error type users see: it names the field, the value and what is allowed."""


class InputError(ValueError):
    """Bad user input. ``str(err)`` is one line: ``field=value: allowed``."""

    def __init__(self, field: str, value, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r}: {allowed}")


class RunError(InputError):
    """A run that cannot go on, said as what is wrong and what to do (one line, exit code 2):
    a rank that failed, a missing dependency. ``field`` still names what it concerns."""

    def __init__(self, field: str, value, message: str):
        super().__init__(field, value, message)
        self.args = (message,)

    def __str__(self) -> str:
        return self.args[0]
