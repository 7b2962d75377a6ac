"""The CLI's words for the API's: an error message that tells an API client which route to call
names, for a terminal user, the command that calls it.

The API's messages name routes (`run POST /v1/evals first`), since most of its clients are
programs; the CLI prints the same message with the route replaced by the `mint` command that
does the same (`run `mint evals run` first`). Routes without a command stay as they are.
"""

from __future__ import annotations

import re

# Most specific first: a route is replaced by the first pattern that matches it.
ROUTE_COMMANDS: tuple[tuple[str, str], ...] = (
    (r"POST /v1/fine_tuning/jobs/estimate", "mint jobs create --estimate"),
    (r"(?:POST )?/v1/fine_tuning/jobs(?![/\w])", "mint jobs create"),
    (r"(?:POST )?/v1/datasets/from-failures", "mint evals failures"),
    (r"POST /v1/(?:files|datasets)(?![/\w])", "mint datasets upload"),
    (r"/v1/(?:files|datasets)(?![/\w{])", "mint datasets list"),
    (r"POST /v1/evals(?![/\w])", "mint evals run"),
    (r"/v1/evals/\{eval_id\}/trajectories", "mint evals trajectories"),
    (r"/v1/evals(?![/\w])", "mint evals list"),
    (r"POST /v1/benchmarks(?![/\w])", "mint benchmarks create"),
    (r"/v1/benchmarks(?![/\w{])", "mint benchmarks list"),
    (r"/v1/base_models(?![/\w])", "mint models list"),
    (r"/v1/adapters(?![/\w{])", "mint adapters list"),
    (r"POST /v1/autotune(?![/\w])", "mint auto start"),
    (r"/v1/autotune(?![/\w{])", "mint auto list"),
    (r"POST /v1/deployments(?![/\w])", "mint deploy"),
    (r"/v1/deployments(?![/\w{])", "mint deployments list"),
    (r"POST /v1/webhooks(?![/\w])", "mint webhooks create"),
    (r"(?:POST )?/v1/captures/\{(?:id|completion_id)\}/feedback", "mint captures feedback"),
)
# A route named without a method is the same route read with GET: `GET /v1/adapters` too.
_PATTERNS = [
    (re.compile(pattern if pattern.startswith(("POST", "(?:POST")) else rf"(?:GET )?{pattern}"), command)
    for pattern, command in ROUTE_COMMANDS
]


def in_cli_words(message: str) -> str:
    """`message` with every route that a command calls replaced by that command, in backticks
    (a route already in backticks keeps one pair)."""
    for pattern, command in _PATTERNS:
        message = re.sub(rf"`?{pattern.pattern}`?", f"`{command}`", message)
    return message
