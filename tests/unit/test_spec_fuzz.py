"""The spec reader under random input (bounded property-based fuzzing): whatever a file or flags hold, the
result is a valid spec or a SpecError that names a key; never another exception. A spec that passes also
passes the wire's checks on the coordinator's side, unchanged."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfcluster import spec as specs
from tfcluster.spec import SpecError
from tfcluster.specfile import load_spec_file, parse_spec, resolve_paths
from tfcluster.wire import spec_from_proto, spec_to_proto

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text that tends to break things: control characters, NUL, newlines at the end, huge and odd numbers as
# strings, path tricks, non-ASCII.
NASTY = st.sampled_from(["", "\0", "a\n", "\n", "\x1b[31m", "../..", "/", "x" * 5000, "nan", "inf", "-1",
                         "worker", "é", "\ud7ff", " ", "a b", "TF_CONFIG", "TFCLUSTER_X", "mirrored"])
TEXT = st.one_of(NASTY, st.text(max_size=30))
SCALAR = st.one_of(TEXT, st.integers(min_value=-2**70, max_value=2**70), st.floats(), st.booleans())
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)


def mostly(good, bad=VALUE):
    """Nine times in ten a good value (so that a spec gets far into the checks), else anything at all."""
    return st.integers(0, 9).flatmap(lambda i: bad if i == 0 else good)


NUMBER = st.one_of(st.floats(0, 1e6), st.floats())
ROLE = st.fixed_dictionaries({}, optional={
    "count": mostly(st.integers(-1, 4)), "gpus": mostly(st.integers(-1, 9)),
    "command": mostly(st.lists(mostly(st.sampled_from(["python3", "-c", "x\ny"]), TEXT), max_size=3)),
    "env": mostly(st.dictionaries(mostly(st.sampled_from(["A", "B_2"]), TEXT), mostly(st.just("v"), TEXT),
                                  max_size=3)),
    "nodes": mostly(st.lists(mostly(st.sampled_from(["n1", "n2.x"]), TEXT), max_size=3)),
    "entrypoint": mostly(st.just("tfcluster.demo.digits:evaluation"), TEXT),
})
SPEC = st.fixed_dictionaries({
    "name": mostly(st.sampled_from(["job", "a-b_c"])),
    "strategy": mostly(st.sampled_from(list(specs.STRATEGIES))),
    "command": mostly(st.just(["python3", "train.py"]), st.lists(TEXT, max_size=3)),
}, optional={
    "workdir": mostly(st.sampled_from(["/srv", "rel/dir"]), TEXT),
    "checkpoint_dir": mostly(st.just("/ckpt"), TEXT), "model_dir": mostly(st.just("/m"), TEXT),
    "env": mostly(st.dictionaries(mostly(st.sampled_from(["A", "B"]), TEXT), mostly(st.just("v"), SCALAR),
                                  max_size=3)),
    "gpus": mostly(st.integers(-1, 9)),
    "stop_grace_seconds": mostly(NUMBER), "evaluator_deadline_seconds": mostly(NUMBER),
    "roles": mostly(st.dictionaries(mostly(st.sampled_from(["chief", "worker", "ps", "evaluator"]), TEXT),
                                    mostly(ROLE), max_size=4)),
    "restart": mostly(st.fixed_dictionaries({}, optional={
        "max_restarts": mostly(st.integers(-1, 2000)), "backoff_seconds": mostly(NUMBER),
        "permanent_exit_codes": mostly(st.lists(st.integers(-5, 300), max_size=3)),
        "hang_seconds": mostly(NUMBER)})),
})


@FUZZ
@given(data=st.one_of(SPEC, VALUE))
def test_any_plain_data_is_a_valid_spec_or_a_spec_error(data):
    try:
        spec = parse_spec(data, source="fuzz")
    except SpecError as e:
        assert e.key is not None and str(e).startswith("fuzz")
        return
    # Accepted: it must be acceptable on the coordinator's side too, once its paths are resolved.
    resolved = resolve_paths(spec, __import__("pathlib").Path("/srv"))
    assert spec_from_proto(spec_to_proto(resolved)) == resolved


GOOD_FILE = b"""name = "job"
strategy = "multi_worker_mirrored"
command = ["python3", "train.py"]
env = { A = "1" }
[roles.worker]
count = 2
gpus = 1
[restart]
max_restarts = 3
"""


@st.composite
def mutated_file(draw) -> bytes:
    """The good file with a few bytes replaced, inserted or removed: TOML that still mostly parses."""
    data = bytearray(GOOD_FILE)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        action, byte = draw(st.sampled_from(["replace", "insert", "delete"])), draw(st.integers(0, 255))
        if action == "insert" or at == len(data):
            data.insert(at, byte)
        elif action == "replace":
            data[at] = byte
        else:
            del data[at]
    return bytes(data)


@FUZZ
@given(raw=st.one_of(mutated_file(), mutated_file(), st.binary(max_size=400)))
def test_any_file_is_a_valid_spec_or_a_spec_error(raw, tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "job.toml"
    path.write_bytes(raw)
    try:
        load_spec_file(path)
    except SpecError as e:
        assert str(path) in str(e)
