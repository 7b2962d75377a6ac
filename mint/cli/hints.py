"""The CLI's words for the API's: an error message that tells an API client which route to call
names, for a terminal user, the command that calls it.

The API's messages name routes (`run POST /v1/evals first`), since most of its clients are
programs; the CLI prints the same message with the route replaced by the `mint` command that
does the same (`run `mint evals run` first`). Routes without a command stay as they are.
"""

from __future__ import annotations

import re
from functools import partial

# The deployment a route names: a placeholder (`{id}`, shown as NAME) or a real id or name.
_DEPLOYMENT = r"(?P<deployment>\{(?:id|deployment_id)\}|[\w.:-]+)"
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
    # Capture with tokens: the body that turns it on becomes the flags that do (the id may be real).
    (
        rf'PATCH /v1/deployments/{_DEPLOYMENT}/capture \{{"rate": 1, "tokens": true\}}',
        "mint deployments capture {deployment} --rate 1 --tokens",
    ),
    (rf"PATCH /v1/deployments/{_DEPLOYMENT}/capture", "mint deployments capture {deployment}"),
    (r"(?:POST )?/v1/episodes/\{(?:id|key|episode_id)\}/reward", "mint episodes reward"),
    (r"/v1/episodes/\{(?:id|key|episode_id)\}(?![/\w])", "mint episodes get"),
    (r"/v1/episodes(?![/\w{])", "mint episodes list"),
)
# A route named without a method is the same route read with GET: `GET /v1/adapters` too.
_PATTERNS = [
    (re.compile(pattern if pattern.startswith(("POST", "(?:POST", "PATCH")) else rf"(?:GET )?{pattern}"), command)
    for pattern, command in ROUTE_COMMANDS
]


def in_cli_words(message: str) -> str:
    """`message` with every route that a command calls replaced by that command, in backticks
    (a route already in backticks keeps one pair). A command may carry a part of its route
    (`{deployment}`: the deployment the route names, or `NAME` where it names a placeholder)."""
    for pattern, command in _PATTERNS:
        message = re.sub(rf"`?{pattern.pattern}`?", partial(_command, command), message)
    return message


def _command(command: str, match: re.Match[str]) -> str:
    parts = {name: "NAME" if value.startswith("{") else value for name, value in match.groupdict().items() if value}
    return f"`{command.format(**parts)}`"
