"""Tests for imagegen.executors.bake_log: buildx bake's plain progress split into one log per cell (its
companion log and audit targets included), the console's per-step and compile-progress lines, failure
detection, and the tail that says what went wrong."""

from __future__ import annotations

from imagegen.executors.bake_log import AUDIT_SUFFIX, LOG_SUFFIX, PROGRESS_EVERY_S, TargetLogs, cell_of

COMPILE = "#9 [a-1 builder 5/6] RUN python /imagegen/imagegen_build.py build --cell /imagegen/cell.json"


class Clock:
    """A clock the test moves by hand (TargetLogs takes one, as it takes time.monotonic)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _logs(tmp_path, targets=("a-1",)):
    said: list[str] = []
    clock = Clock()
    return TargetLogs(tmp_path, list(targets), say=said.append, clock=clock), said, clock


# ------------------------------------------------------------------------------- splitting


def test_target_logs_split_and_detect_failure(tmp_path):
    logs = TargetLogs(tmp_path, ["a-1", "b-2"])
    steps = [logs.feed(line) for line in [
        "#5 [a-1 builder 3/3] RUN python x",
        "#5 [a-1 builder 3/3] RUN python x",  # repeated header: no second progress line
        "#5 12.0 foo.cu(4): error: expected a declaration",
        "#6 [b-2 base 5/5] RUN pip install",
        "#6 1.0 Collecting torch",
        "#5 ERROR: process \"x\" did not complete successfully: exit code: 1",
        "#6 CANCELED",
    ]]
    assert [s for s in steps if s] == [("a-1", "builder 3/3 RUN python x"), ("b-2", "base 5/5 RUN pip install")]
    assert logs.failed == {"a-1"}
    assert "foo.cu(4): error: expected a declaration" in "\n".join(logs.tail("a-1"))
    logs.close()
    assert (tmp_path / "b-2.log").read_text().count("\n") == 3


def test_audit_target_lines_go_to_the_cells_log(tmp_path):
    logs = TargetLogs(tmp_path, ["a-1"])
    step = logs.feed("#7 [a-1--audit audit 1/1] RUN python /imagegen/imagegen_build.py audit --out /imagegen/audit/audit.json")
    assert step is not None and step[0] == "a-1" and step[1].startswith("audit 1/1 RUN python /imagegen/imagegen_build.py audit")
    logs.feed("#7 3.2 [imagegen] audit: ok in 3.1 s: 1 extension(s)")
    logs.feed("ERROR: target a-1--audit: failed to solve: boom")
    assert logs.failed == {"a-1"}
    logs.close()
    assert "audit: ok in 3.1 s" in (tmp_path / "a-1.log").read_text()


def test_a_sole_targets_unnamed_vertices_are_its_own(tmp_path):
    # bake prefixes vertex names with the target only when it runs several targets.
    logs = TargetLogs(tmp_path, ["a-1", "b-2"])
    logs.sole = "a-1"
    assert logs.feed("#3 [internal] load metadata for docker.io/x") is None
    assert logs.feed("#11 [audit 1/1] RUN python /imagegen/imagegen_build.py audit --out x")[0] == "a-1"
    logs.feed("#11 0.5 [imagegen] audit: ok in 0.4 s")
    logs.close()
    text = (tmp_path / "a-1.log").read_text()
    assert "imagegen_build.py audit" in text and "audit: ok" in text and "load metadata" not in text
    assert (tmp_path / "b-2.log").read_text() == ""


def test_cell_of_strips_one_companion_suffix():
    assert cell_of("sage-2_2_0-torch2_8-cu128-py312") == "sage-2_2_0-torch2_8-cu128-py312"
    assert cell_of("sage-2_2_0-torch2_8-cu128-py312" + LOG_SUFFIX) == "sage-2_2_0-torch2_8-cu128-py312"
    assert cell_of("sage-2_2_0-torch2_8-cu128-py312" + AUDIT_SUFFIX) == "sage-2_2_0-torch2_8-cu128-py312"
    assert cell_of("x--log--audit") == "x--log"  # only the last one: a cell name may contain the other


def test_one_log_per_cell_even_when_given_its_companions(tmp_path):
    logs = TargetLogs(tmp_path / "logs", ["a-1", "a-1" + LOG_SUFFIX, "a-1" + AUDIT_SUFFIX])
    step = logs.feed("#4 [a-1--log buildlog 1/1] COPY --from=builder /imagegen/logs /")
    assert step == ("a-1", "buildlog 1/1 COPY --from=builder /imagegen/logs /")
    logs.feed("#4 0.1 copied")
    logs.close()
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["a-1.log"]  # the folder is made, one file
    assert (tmp_path / "logs" / "a-1.log").read_text().splitlines() == [
        "#4 [a-1--log buildlog 1/1] COPY --from=builder /imagegen/logs /", "#4 0.1 copied"]


def test_lines_of_other_targets_and_bakes_own_lines_stay_out(tmp_path):
    logs = TargetLogs(tmp_path, ["a-1"])
    assert logs.feed("#1 [other-9 builder 1/2] RUN make") is None
    logs.feed("#1 0.3 compiling other")  # a vertex no cell owns
    logs.feed("#2 [a-1 internal] load build definition from a-1.Dockerfile")  # no step: not a console line
    logs.feed("ERROR: target other-9: failed to solve: boom")  # a target this run did not ask for
    logs.feed("#1 ERROR: process did not complete")
    assert logs.failed == set()
    logs.close()
    assert (tmp_path / "a-1.log").read_text() == "#2 [a-1 internal] load build definition from a-1.Dockerfile\n"


def test_a_header_reports_a_step_once_until_the_step_changes(tmp_path):
    logs = TargetLogs(tmp_path, ["a-1"])
    first = logs.feed("#5 [a-1 base 2/6] RUN   pip   install torch==2.8.0")
    assert first == ("a-1", "base 2/6 RUN pip install torch==2.8.0")  # blanks folded
    assert logs.feed("#5 [a-1 base 2/6] RUN   pip   install torch==2.8.0") is None
    long = logs.feed("#6 [a-1 base 3/6] RUN " + "x" * 200)
    assert long is not None and long[1] == "base 3/6 " + ("RUN " + "x" * 200)[:70]
    assert logs.feed("#5 [a-1 base 2/6] RUN   pip   install torch==2.8.0") == first  # back to it: said again
    logs.close()


# -------------------------------------------------------------------------- compile progress


def test_a_long_compile_says_when_it_starts_how_it_goes_and_when_it_is_done(tmp_path):
    logs, said, clock = _logs(tmp_path)
    logs.feed(COMPILE)
    assert said == []  # "compiling" waits for the step's first output (a CACHED step has none)
    clock.now += 1
    logs.feed("#9 1.02 [imagegen] building with MAX_JOBS=4")
    assert said == ["[a-1] compiling"]
    clock.now += 29
    logs.feed("#9 30.1 [imagegen] nvcc done: csrc/a.cu (29 s)")
    assert len(said) == 1  # at most one line every PROGRESS_EVERY_S
    clock.now += PROGRESS_EVERY_S
    logs.feed("#9 75.0 [imagegen] still compiling (75 s)")  # the heartbeat is not the "last" line
    assert said[-1] == "[a-1] compiling, 1m15s, last: [imagegen] nvcc done: csrc/a.cu (29 s)"
    clock.now += 10
    logs.feed("#9 85.0 [imagegen] nvcc done: csrc/b.cu")
    assert len(said) == 2
    logs.feed("#9 DONE 125.3s")
    assert said[-1] == "[a-1] compiled in 2m05s"
    logs.feed("#9 126.0 after the step")  # done: no more progress for this vertex
    assert len(said) == 3 and logs.failed == set()
    logs.close()


def test_a_failed_compile_leads_with_the_compilers_first_error(tmp_path):
    logs, said, clock = _logs(tmp_path)
    logs.feed(COMPILE)
    logs.feed("#9 2.0 [imagegen] error: nvcc failed on csrc/a.cu: expected a declaration")
    logs.feed("#9 2.1 [imagegen] error: a second error is not the first")
    clock.now += 90
    logs.feed('#9 ERROR: process "/bin/sh -c python /imagegen/imagegen_build.py build" did not complete successfully')
    assert said == ["[a-1] compiling",
                    "[a-1] compile failed after 1m30s: nvcc failed on csrc/a.cu: expected a declaration"]
    assert logs.errors == {"a-1": "nvcc failed on csrc/a.cu: expected a declaration"} and logs.failed == {"a-1"}
    logs.close()


def test_a_failed_compile_without_an_imagegen_error_quotes_bakes(tmp_path):
    logs, said, clock = _logs(tmp_path)
    logs.feed(COMPILE)
    clock.now += 5
    logs.feed("#9 ERROR: process did not complete successfully: exit code: 137")
    assert said == ["[a-1] compile failed after 0m05s: process did not complete successfully: exit code: 137"]
    logs.close()


def test_cancelled_and_cached_compiles(tmp_path):
    logs, said, clock = _logs(tmp_path, ["a-1", "b-2"])
    logs.feed(COMPILE)
    logs.feed("#9 0.5 started")
    clock.now += 10
    logs.feed("#9 CANCELED")
    assert said[-1] == "[a-1] compile cancelled after 0m10s" and logs.failed == set()
    logs.feed("#12 [b-2 builder 5/6] RUN python /imagegen/imagegen_build.py build --cell /imagegen/cell.json")
    logs.feed("#12 CACHED")
    logs.feed("#12 DONE 0.0s")
    assert said == ["[a-1] compiling", "[a-1] compile cancelled after 0m10s"]  # a cached step says nothing
    logs.close()


def test_without_say_progress_is_only_in_the_logs(tmp_path):
    logs = TargetLogs(tmp_path, ["a-1"])
    logs.feed(COMPILE)
    logs.feed("#9 0.5 [imagegen] error: boom")
    logs.feed("#9 ERROR: process did not complete successfully")
    assert logs.failed == {"a-1"} and logs.errors == {"a-1": "boom"}
    logs.close()
    assert (tmp_path / "a-1.log").read_text().count("\n") == 3


# ----------------------------------------------------------------------------------- the tail


def test_tail_puts_the_last_errors_first_then_the_last_lines(tmp_path):
    logs = TargetLogs(tmp_path, ["a-1"])
    logs.feed("#5 [a-1 builder 5/6] RUN make")
    for i in range(30):
        logs.feed(f"#5 1.{i:02d} k{i}.cu(1): error: bad")
    logs.feed("#5 2.0 Killed")
    logs.feed("#5 2.1 make: leaving directory")
    tail = logs.tail("a-1")  # before close: the log is flushed first
    assert tail[:17] == [f"#5 1.{i:02d} k{i}.cu(1): error: bad" for i in range(14, 30)] + ["#5 2.0 Killed"]
    assert tail[17:] == ["#5 2.1 make: leaving directory"]
    assert logs.tail("a-1", n=5) == ["#5 1.29 k29.cu(1): error: bad", "#5 2.0 Killed", "#5 2.1 make: leaving directory"]
    assert logs.tail("never-built") == []  # no log: nothing to show, no error
    logs.close()


def test_tail_of_a_log_without_errors_is_its_last_lines(tmp_path):
    logs = TargetLogs(tmp_path, ["a-1"])
    for line in ["#5 [a-1 base 1/2] RUN apt-get update", "#5 0.1 one", "#5 0.2 two", "#5 0.3 three"]:
        logs.feed(line)
    assert logs.tail("a-1") == ["#5 0.1 one", "#5 0.2 two", "#5 0.3 three"]
    logs.close()
