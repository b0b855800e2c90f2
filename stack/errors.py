"""The one error the stack raises: a single line naming the cause and the fix."""


class StackError(Exception):
    """Printed as one line by the CLI, which then exits non-zero."""
