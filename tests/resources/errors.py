"""A user error count for Resample-on-Correct: tool errors reported in the completion."""


def tool_errors(completion: str, answer: str | None, meta: str | None) -> int:
    return completion.count("ERR")
