"""Benchmark files: JSONL or YAML tasks, validated once, stored in one canonical form.

A task is one JSON object (a JSONL line, or an item of the YAML `tasks` list; a JSONL line may
also be a TRL, verl or OpenRLHF prompt row, see `_foreign_task`, and a benchmark may be made of
an uploaded prompts dataset's rows, `benchmark_of_rows`):

    {"id": "q1",
     "messages": [{"role": "user", "content": "What is 2 + 3?"}],
     "reference": "5",
     "grader": {"type": "numeric"},                      # optional: overrides the benchmark's
     "split": "heldout",                                 # optional: a label runs can select
     "tools": [{"type": "function", "function": {...}}],  # optional, OpenAI format
     "environment": [{"name": "lookup_order", "arguments": {"order_id": "A1"}, "result": {...}}],
     "solution": [{"role": "assistant", ...}, ...],      # optional: the ideal continuation
     "metadata": {...}}

`messages` is the conversation before the model's turn; `environment` scripts each tool's
result for exact arguments (see `mint.evals.environments`); `solution` is the reference
trajectory (assistant messages, and tool messages answering its calls), which mining turns
into training rows. A YAML file is either a list of tasks or a mapping with `tasks` and an
optional benchmark-level `grader` and `description`; a JSONL benchmark takes its benchmark-level
grader from the request. Every task ends up with one grader from the closed registry.

Validation is complete before anything is stored: every problem names its line (and task id)
and the field, e.g. `line 3 (task 'q3'): messages[0].role: must be one of ...`. A task whose
reference its grader cannot read, or whose solution does not pass its own grader, is refused
here rather than scoring 0 in every run.

`canonical_jsonl` writes the tasks, each with its resolved grader, as sorted-key JSON lines;
its sha256 (`content_hash`) names a benchmark version's content.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mint.chat.formats import convert, detect
from mint.chat.rows import validate_chat_row, validate_prompt_row
from mint.chat.tool_calls import ScriptedCall
from mint.errors import InvalidRequest
from mint.evals.agent_environments import prompt_row_environment_errors
from mint.evals.builtin import Task as BuiltinTask
from mint.evals.environments import Environment
from mint.evals.graders import Grade, GradeContext, GraderSpec, Output, grade
from mint.schemas.common import loads_finite
from mint.schemas.plans import EnvironmentSpecIn
from mint.schemas.remote_environments import REMOTE_ENVIRONMENT

BenchmarkFormat = Literal["jsonl", "yaml"]
FORMATS: tuple[BenchmarkFormat, ...] = ("jsonl", "yaml")
MAX_TASKS = 50_000
MAX_TASK_ID_CHARS = 200  # the trajectories table's task_id column
SPLIT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,49}$"
TASK_FIELDS = ("id", "messages", "tools", "environment", "reference", "grader", "split", "solution", "metadata")
YAML_FIELDS = ("tasks", "grader", "description")
# Errors listed in one message; the rest are counted.
MAX_LISTED_ERRORS = 20
# Graders whose verdict needs more than the output and the reference (a model, code in Mint, a
# reward endpoint):
# their references and solutions are not checked at upload.
_UNCHECKED_GRADERS = {"environment", "judge", "python", "remote"}
_TASK_ID = re.compile(r"^[^\x00-\x1f\x7f]+$")


class BenchmarkTask(BaseModel):
    """One validated task with its resolved grader; serialises to one canonical JSONL line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=MAX_TASK_ID_CHARS)
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    # Scripted tool results, or an environment that plays the task's episodes: one registered in
    # Mint's code, or `remote`, a task of an environment server the team hosts.
    environment: list[ScriptedCall] | EnvironmentSpecIn = Field(default_factory=list)
    reference: Any = None
    grader: GraderSpec
    split: str | None = None
    solution: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def uses_tools(self) -> bool:
        """Whether the model's tool calls are answered (the task offers tools or scripts results)."""
        return bool(self.tools) or bool(self.environment)

    @property
    def named_environment(self) -> EnvironmentSpecIn | None:
        """The environment that plays this task's episodes, where one does (not scripted results)."""
        return self.environment if isinstance(self.environment, EnvironmentSpecIn) else None

    @property
    def scripted_calls(self) -> list[ScriptedCall]:
        """The tool results this task scripts (none where an environment plays it)."""
        return self.environment if isinstance(self.environment, list) else []

    def make_environment(self) -> Environment:
        """A fresh environment that replays this task's scripted tool results."""
        names = [tool["function"]["name"] for tool in self.tools or [] if isinstance(tool.get("function"), dict)]
        return Environment(self.scripted_calls, tool_names=names if self.tools is not None else None)

    def grade(self, output: Output, *, context: GradeContext | None = None) -> Grade:
        """Score an output (a completion, an assistant message or the messages a run added); a
        context learns the task's prompt and metadata (what a `remote` grader sends)."""
        if context is not None:
            context = context.about(self.messages, self.metadata, self.id)
        return grade(self.grader, output, self.reference, context=context)

    @classmethod
    def from_builtin(cls, task: BuiltinTask) -> BenchmarkTask:
        """A built-in task, its split taken from its metadata."""
        data = task.model_dump(mode="json")
        split = data["metadata"].get("split")
        return cls.model_validate({**data, "split": split})


@dataclass(frozen=True)
class ParsedBenchmark:
    """What a benchmark file holds: its tasks, its benchmark-level grader and description (YAML)."""

    tasks: list[BenchmarkTask]
    grader: GraderSpec | None
    description: str | None = None

    @property
    def splits(self) -> dict[str, int]:
        return splits_of(self.tasks)


def splits_of(tasks: Sequence[BenchmarkTask]) -> dict[str, int]:
    """How many tasks carry each split label (tasks without one are in no split)."""
    return dict(sorted(Counter(task.split for task in tasks if task.split is not None).items()))


# ---- reading the file ------------------------------------------------------------------------


class _Problems:
    """Collects problems as `where: field: message`; raises them all at once."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")

    def raise_if_any(self) -> None:
        if not self.items:
            return
        count = len(self.items)
        listed = "; ".join(self.items[:MAX_LISTED_ERRORS])
        more = f"; and {count - MAX_LISTED_ERRORS} more" if count > MAX_LISTED_ERRORS else ""
        noun = "problem" if count == 1 else "problems"
        raise InvalidRequest(
            f"the benchmark has {count} {noun}, nothing was stored: {listed}{more}. "
            "Fix them and send the whole benchmark again.",
            param="content",
        )


def _jsonl_items(content: str, problems: _Problems) -> Iterator[tuple[str, Any]]:
    for number, line in enumerate(content.removeprefix("\ufeff").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = loads_finite(line)
        except (ValueError, RecursionError) as exc:
            problems.add(f"line {number}", f"not valid JSON ({exc}); write one task object per line")
            continue
        yield f"line {number}", _foreign_task(row, f"line {number}", problems)


def _foreign_task(row: Any, where: str, problems: _Problems) -> Any:
    """A TRL, verl or OpenRLHF prompt row (detected from its keys) as a task; anything else as it is.

    Its id is the row's `id`, else where it is (`line-3`); its reference is the format's
    (verl's `reward_model.ground_truth`, OpenRLHF's label, TRL's `solution`...); the rest of the
    row is kept in `metadata` (see `mint.chat.formats`), where a remote grader reads it.
    """
    if not isinstance(row, dict) or "messages" in row:
        return row
    source = detect(row)
    if source is None or source == "mint":
        return row
    converted = convert(row, source)
    for error in converted.errors:
        problems.add(where, error)
    if converted.errors or converted.row is None:
        return None
    if converted.kind != "prompts":
        problems.add(
            where,
            f"is a {converted.variant} row, which holds an answer to train on; a task is a prompt with a "
            "reference (e.g. TRL prompt + solution, verl prompt + reward_model.ground_truth, OpenRLHF input + label)",
        )
        return None
    return task_of_prompt_row(converted.row, where.replace(" ", "-"))


def task_of_prompt_row(row: Mapping[str, Any], default_id: str) -> dict[str, Any]:
    """An RL prompt row (Mint's shape) as a benchmark task, named by its `id` or by `default_id`."""
    task = {key: row[key] for key in ("messages", "tools", "environment", "reference", "metadata") if key in row}
    return {"id": row.get("id") or default_id, **task}


class _SafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases (a small file could expand to a huge one) and
    without implicit dates (they are not JSON; a date-like value stays a string)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(
                None, None, "aliases (*name) are not supported; write the value out", event.start_mark
            )
        return super().compose_node(parent, index)


_SafeLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _yaml_problem(exc: yaml.YAMLError, problems: _Problems) -> None:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}" if mark is not None else "content"
    # ReaderError (a character YAML does not allow) names it `reason`, with its code point.
    reason = getattr(exc, "problem", None) or getattr(exc, "reason", None) or str(exc)
    character = getattr(exc, "character", None)
    if isinstance(character, int):
        reason = f"{reason}: U+{character:04X}"
    problems.add(where, f"not valid YAML ({reason})")


def _yaml_document(content: str, problems: _Problems) -> tuple[Any, list[int]]:
    """The YAML document and the line of each task of its task list (1-based)."""
    try:
        loader = _SafeLoader(content)  # refuses non-printable characters as it opens
    except yaml.YAMLError as exc:
        _yaml_problem(exc, problems)
        return None, []
    try:
        node = loader.get_single_node()
        if node is None:
            return None, []
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        _yaml_problem(exc, problems)
        return None, []
    finally:
        loader.dispose()
    tasks_node = node
    if isinstance(node, yaml.MappingNode):
        tasks_node = next((value for key, value in node.value if key.value == "tasks"), None)
    lines = [item.start_mark.line + 1 for item in tasks_node.value] if isinstance(tasks_node, yaml.SequenceNode) else []
    return data, lines


def _yaml_items(content: str, problems: _Problems) -> tuple[list[tuple[str, Any]], dict[str, Any] | None, str | None]:
    data, lines = _yaml_document(content, problems)
    if problems.items or data is None:
        return [], None, None
    grader: dict[str, Any] | None = None
    description: str | None = None
    if isinstance(data, dict):
        for key in data:
            if key not in YAML_FIELDS:
                problems.add(str(key), f"unknown top-level field; allowed: {', '.join(YAML_FIELDS)}")
        grader = data.get("grader")
        if "description" in data:
            if isinstance(data["description"], str):
                description = data["description"]
            else:
                problems.add("description", "must be a string")
        tasks = data.get("tasks")
        if not isinstance(tasks, list):
            problems.add("tasks", "is required: a list of task objects")
            return [], grader, description
    elif isinstance(data, list):
        tasks = data
    else:
        problems.add("content", "a YAML benchmark is a list of tasks, or a mapping with `tasks` (and `grader`)")
        return [], None, None
    if len(lines) != len(tasks):  # cannot happen for a plain document; fall back to positions
        lines = [0] * len(tasks)
    items = [
        (f"line {line}" if line else f"tasks[{index}]", task)
        for index, (line, task) in enumerate(zip(lines, tasks, strict=True))
    ]
    return items, grader, description


# ---- one task --------------------------------------------------------------------------------


def _grader_spec(raw: Any, where: str, problems: _Problems) -> GraderSpec | None:
    """`raw` as a grader spec; a problem is reported as `where: grader: ...`."""
    if isinstance(raw, GraderSpec):
        return raw
    if not isinstance(raw, dict):
        problems.add(where, 'grader: must be an object {"type": ..., "config": {...}}')
        return None
    try:
        return GraderSpec.model_validate(raw)
    except InvalidRequest as exc:
        # Messages about a field start "grader <field>: ..."; the others say what is wrong outright.
        detail = exc.message.removeprefix("grader ") if exc.message.startswith("grader ") else exc.message
        problems.add(where, f"grader: {detail}")
        return None


_MESSAGE_INDEX = re.compile(r"^messages\[(\d+)\]")


def _solution_errors(task: Mapping[str, Any]) -> list[str]:
    """Problems of `solution`, validated as the continuation of `messages`, named as solution[i]."""
    solution = task["solution"]
    if not isinstance(solution, list) or not solution:
        return ["solution: must be a non-empty list of messages (the ideal continuation)"]
    prompt_length = len(task["messages"])
    row: dict[str, Any] = {"messages": [*task["messages"], *solution]}
    if task.get("tools") is not None:
        row["tools"] = task["tools"]
    errors = []
    for error in validate_chat_row(row):
        found = _MESSAGE_INDEX.match(error)
        if found and int(found.group(1)) >= prompt_length:
            error = f"solution[{int(found.group(1)) - prompt_length}]" + error[found.end() :]
        elif found:
            continue  # a problem of `messages` itself, reported already
        errors.append(error)
    return errors


def _tool_names(tools: Any) -> set[str]:
    return {
        tool["function"]["name"]
        for tool in tools or []
        if isinstance(tool, dict)
        and isinstance(tool.get("function"), dict)
        and isinstance(tool["function"].get("name"), str)
    }


def _check_task(
    raw: Any, where: str, default_grader: GraderSpec | None, seen: dict[str, str], problems: _Problems
) -> BenchmarkTask | None:
    if not isinstance(raw, dict):
        problems.add(where, f"a task must be an object with id, messages and reference, got {type(raw).__name__}")
        return None
    before = len(problems.items)
    task_id = raw.get("id")
    if isinstance(task_id, str) and task_id and len(task_id) <= MAX_TASK_ID_CHARS and _TASK_ID.match(task_id):
        if task_id in seen:
            problems.add(f"{where} (task {task_id!r})", f"id: is already used at {seen[task_id]}; ids must be unique")
        else:
            seen[task_id] = where
        where = f"{where} (task {task_id!r})"
    else:
        problems.add(where, f"id: is required: a string of 1-{MAX_TASK_ID_CHARS} printable characters")
    for key in raw:
        if key not in TASK_FIELDS:
            problems.add(where, f"{key}: unknown field; allowed: {', '.join(TASK_FIELDS)}")

    # messages, tools and environment are an RL prompt row's fields: one validator for both.
    prompt = {key: raw[key] for key in ("messages", "tools", "environment") if key in raw}
    for error in validate_prompt_row(prompt) or prompt_row_environment_errors(prompt):
        problems.add(where, error)
    environment = raw.get("environment")
    remote = isinstance(environment, dict) and environment.get("name") == REMOTE_ENVIRONMENT
    if remote and (environment.get("config") or {}).get("task") is None:
        problems.add(where, "environment.config.task: required: the index of the environment server's task")
    tools = raw.get("tools")
    if tools is not None and isinstance(raw.get("environment"), list):
        names = _tool_names(tools)
        for index, entry in enumerate(raw["environment"]):
            if isinstance(entry, dict) and entry.get("name") not in names:
                problems.add(
                    where,
                    f"environment[{index}].name: {entry.get('name')!r} is not one of the task's tools "
                    f"({', '.join(sorted(names)) or 'none'}); script results for the tools the task offers",
                )

    if "grader" in raw:
        spec = _grader_spec(raw["grader"], where, problems)
    elif default_grader is not None:
        spec = default_grader
    else:
        spec = None
        problems.add(where, "grader: no grader; give the benchmark a `grader`, or this task one")

    split = raw.get("split")
    if split is not None and not (isinstance(split, str) and re.match(SPLIT_PATTERN, split)):
        problems.add(where, "split: must be a label of 1-50 letters, digits, '_', '.' or '-' (e.g. heldout)")
    if "metadata" in raw and not isinstance(raw["metadata"], dict):
        problems.add(where, "metadata: must be an object")
    if "solution" in raw and isinstance(raw.get("messages"), list):
        for error in _solution_errors(raw):
            problems.add(where, error)
    if len(problems.items) > before or spec is None:
        return None

    try:
        task = BenchmarkTask.model_validate({**raw, "grader": spec})
        # Not JSON (NaN from YAML's .nan, say) cannot be stored canonically: refuse it here.
        json.dumps(task.model_dump(mode="json"), allow_nan=False)
    except (ValidationError, ValueError) as exc:
        problems.add(where, _first_error(exc))
        return None
    _check_gradable(task, where, problems)
    return task


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        path = ".".join(str(part) for part in error["loc"])
        return f"{path}: {error['msg']}"
    return f"not JSON-compatible: {exc}; write finite numbers"


def _check_gradable(task: BenchmarkTask, where: str, problems: _Problems) -> None:
    """The grader can read the reference, and the solution (if any) passes it."""
    if task.grader.kinds() & _UNCHECKED_GRADERS:  # a composite's parts included
        return
    try:
        task.grade("")
    except InvalidRequest as exc:
        problems.add(where, f"reference: {exc.message}")
        return
    if task.solution is not None:
        verdict = task.grade(task.solution)
        if not verdict.passed:
            problems.add(
                where,
                f"solution: does not pass the task's own grader ({verdict.detail}); fix the solution or the reference",
            )


# ---- the public functions --------------------------------------------------------------------


def parse_benchmark(
    content: str,
    format: BenchmarkFormat,
    *,
    grader: GraderSpec | Mapping[str, Any] | None = None,
    extra_tasks: Sequence[BenchmarkTask] = (),
) -> ParsedBenchmark:
    """Read and validate a benchmark file; raises InvalidRequest listing every problem found.

    `grader` is the benchmark-level grader for tasks without their own (a YAML file may name
    it instead, not both). `extra_tasks` (built-in tasks, say) join the file's tasks and share
    the id namespace.
    """
    if format not in FORMATS:
        raise InvalidRequest(f"format must be one of {', '.join(FORMATS)}, got {format!r}", param="format")
    problems = _Problems()
    description = None
    if format == "jsonl":
        items = list(_jsonl_items(content, problems))
        file_grader = None
    else:
        items, file_grader, description = _yaml_items(content, problems)
    if grader is not None and file_grader is not None:
        problems.add("grader", "is given both in the request and in the YAML file; give it once")
    default = None
    raw_default = grader if grader is not None else file_grader
    if raw_default is not None:
        raw_spec = dict(raw_default) if isinstance(raw_default, Mapping) else raw_default
        default = _grader_spec(raw_spec, "the benchmark", problems)
        if default is None:  # every task without a grader of its own would repeat this problem
            problems.raise_if_any()
    # Tasks are checked even when other lines failed, so one answer lists every problem.
    return _collect(items, default, extra_tasks, description, problems)


def benchmark_of_rows(
    rows: Sequence[Mapping[str, Any]],
    *,
    grader: GraderSpec | Mapping[str, Any] | None = None,
    extra_tasks: Sequence[BenchmarkTask] = (),
) -> ParsedBenchmark:
    """A benchmark of a prompts dataset's rows (row N named `row-N` unless it has an `id`),
    validated as tasks; raises InvalidRequest listing every problem found."""
    problems = _Problems()
    default = None
    if grader is not None:
        default = _grader_spec(dict(grader) if isinstance(grader, Mapping) else grader, "the benchmark", problems)
        problems.raise_if_any()
    items = [(f"row {number}", task_of_prompt_row(row, f"row-{number}")) for number, row in enumerate(rows, start=1)]
    return _collect(items, default, extra_tasks, None, problems)


def build_benchmark(tasks: Sequence[BenchmarkTask], *, grader: GraderSpec | None = None) -> ParsedBenchmark:
    """A benchmark of already validated tasks (built-in ones), checked for unique ids."""
    return _collect([], grader, tasks, None, _Problems())


def _collect(
    items: Sequence[tuple[str, Any]],
    default: GraderSpec | None,
    extra_tasks: Sequence[BenchmarkTask],
    description: str | None,
    problems: _Problems,
) -> ParsedBenchmark:
    if len(items) + len(extra_tasks) > MAX_TASKS:
        raise InvalidRequest(
            f"the benchmark has {len(items) + len(extra_tasks)} tasks; split it into benchmarks of at most {MAX_TASKS}",
            param="content",
        )
    seen: dict[str, str] = {}
    tasks: list[BenchmarkTask] = []
    for where, raw in items:
        if raw is None:  # a row refused on reading, its problems already added
            continue
        task = _check_task(raw, where, default, seen, problems)
        if task is not None:
            tasks.append(task)
    for index, task in enumerate(extra_tasks):
        if task.id in seen:
            problems.add(f"builtin task {index}", f"id: {task.id!r} is already used at {seen[task.id]}")
        seen[task.id] = f"builtin task {index}"
        tasks.append(task)
    if not items and not extra_tasks and not problems.items:
        problems.add("content", "holds no tasks; write one task per line (JSONL) or a `tasks` list (YAML)")
    problems.raise_if_any()
    return ParsedBenchmark(tasks=tasks, grader=default, description=description)


def canonical_jsonl(tasks: Sequence[BenchmarkTask]) -> bytes:
    """The tasks as UTF-8 JSON lines, keys sorted, no spaces: the same tasks give the same bytes."""
    lines = [
        json.dumps(
            task.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        for task in tasks
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")


def content_hash(tasks: Sequence[BenchmarkTask]) -> str:
    """sha256 of the canonical form: a benchmark version's identity."""
    return hashlib.sha256(canonical_jsonl(tasks)).hexdigest()


def load_canonical(data: bytes) -> list[BenchmarkTask]:
    """Tasks back from `canonical_jsonl` bytes (as stored for a benchmark version)."""
    return [BenchmarkTask.model_validate_json(line) for line in data.decode("utf-8").splitlines() if line]


def select_split(tasks: Sequence[BenchmarkTask], split: str | None) -> list[BenchmarkTask]:
    """The tasks of one split, or all of them for None."""
    return list(tasks) if split is None else [task for task in tasks if task.split == split]
