"""hardware.config against hostile machine configs ("parser bombs"): every one ends quickly as a
one-line ConfigError `file: place: reason`, and both CLIs exit 2 with that line."""

import json
from pathlib import Path

import pytest

from conftest import CONFIGS, ROOT, assert_one_line_error, run_cli
from hardware import ConfigError, load_machine, machine_from_dict
from hardware.config import MAX_CONFIG_BYTES, MAX_DEPTH

MINIMAL = json.loads((CONFIGS / "minimal.json").read_text())
RAW = "RAW_VALUE"  # stands for text spliced into a config unquoted


def config_text(suffix: str, key: str = "", raw: str = "") -> str:
    """The minimal config as JSON or YAML text, with the dotted `key` set to the literal `raw`."""
    document = json.loads(json.dumps(MINIMAL))
    if key:
        *parents, last = key.split(".")
        node = document
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = RAW
    if suffix == ".json":
        return json.dumps(document, indent=1).replace(f'"{RAW}"', raw)
    return json_to_block_yaml(document).replace(RAW, raw)


def json_to_block_yaml(document: dict, indent: str = "") -> str:
    lines = []
    for key, value in document.items():
        if isinstance(value, dict):
            lines.append(f"{indent}{key}:\n{json_to_block_yaml(value, indent + '  ')}")
        else:
            lines.append(f"{indent}{key}: {value if value == RAW else json.dumps(value)}")
    return "\n".join(lines)


def error(tmp_path: Path, name: str, content: str | bytes) -> str:
    """The one-line message load_machine raises for a file `name` holding `content`."""
    path = tmp_path / name
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_machine(path)
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    assert message.startswith(f"{path}: "), message
    return message[len(f"{path}: "):]


def billion_laughs(levels: int = 9) -> str:
    """Nine strings, then eight levels of nine aliases each to the level below: 9^9 values."""
    rows = ['name: [&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"],']
    rows += [f"  &a{i} [{','.join([f'*a{i - 1}'] * 9)}]," for i in range(1, levels)]
    return "\n".join(rows) + f"\n  *a{levels - 1}]\n"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# --- the reported defects -------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_config_text_is_the_minimal_config(tmp_path, suffix):
    path = tmp_path / f"minimal{suffix}"
    path.write_text(config_text(suffix))
    assert load_machine(path) == load_machine(CONFIGS / "minimal.json")


def test_yaml_alias_bomb_is_refused_at_the_first_anchor(tmp_path):
    assert len(billion_laughs()) < 500
    assert error(tmp_path, "bomb.yaml", billion_laughs()) == \
        "line 1, column 8: invalid YAML: anchors and aliases are not allowed"


@pytest.mark.parametrize("text, line", [
    ("name: &n x\n", 1),  # an anchor alone: configs never need one
    ("base: {a: 1}\nother: *base\n", 2),  # an alias to nothing
])
def test_any_yaml_anchor_or_alias_is_refused(tmp_path, text, line):
    assert error(tmp_path, "a.yaml", text).startswith(f"line {line}, column ")


@pytest.mark.parametrize("name, text, place", [
    ("deep.json", nested(10_000), "line 1"),
    ("deep.yaml", nested(15_000), "line 1, column 17: invalid YAML"),
    ("deep.yaml", "- " * 15_000 + "x", "line 1, column 33: invalid YAML"),  # block style
])
def test_deep_nesting_is_refused(tmp_path, name, text, place):
    assert error(tmp_path, name, text) == f"{place}: nested deeper than {MAX_DEPTH} levels"


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_depth_limit_is_the_same_in_both_formats(tmp_path, suffix):
    # the top-level mapping is the first level
    at_limit = config_text(suffix, "description", nested(MAX_DEPTH - 1))
    assert error(tmp_path, f"a{suffix}", at_limit).startswith("description: must be a string, got [[[")
    too_deep = config_text(suffix, "description", nested(MAX_DEPTH))
    assert error(tmp_path, f"b{suffix}", too_deep).endswith(f"nested deeper than {MAX_DEPTH} levels")


def test_the_reported_depths_are_refused_for_their_size(tmp_path):
    # JSON 100,000 deep and YAML 20,000 deep are larger than any config may be
    for name, text in (("deep.json", nested(100_000)), ("deep.yaml", nested(20_000))):
        assert error(tmp_path, name, text).endswith(f"larger than the {MAX_CONFIG_BYTES // 1024} KB a config may be")


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
@pytest.mark.parametrize("key", ["timing.dram_latency_cycles", "name", "address_map.base"])
def test_huge_integer_literal_names_its_key(tmp_path, suffix, key):
    message = error(tmp_path, f"c{suffix}", config_text(suffix, key, "9" * 5000))
    assert message.startswith(f"{key}: must be ")
    assert message.endswith(", got an integer literal of 5000 characters (at most 64)")


@pytest.mark.parametrize("literal", ["0b" + "1" * 20_000, "0x" + "f" * 20_000, "0" + "7" * 20_000,
                                     ":".join(["59"] * 5000), "-" + "1_" * 5000 + "1"])
def test_huge_yaml_integer_in_any_notation(tmp_path, literal):
    message = error(tmp_path, "c.yaml", config_text(".yaml", "timing.dram_latency_cycles", literal))
    assert message.startswith("timing.dram_latency_cycles: must be a non-negative integer up to 1000000, got an "
                              "integer literal of ")


@pytest.mark.parametrize("key, raw, reason", [
    # 2^62 cycles of latency was accepted, then the cycle counts overflowed the JSON report
    ("timing.dram_latency_cycles", f"{2**62}", f"must be a non-negative integer up to 1000000, got {2**62}"),
    ("timing.line_bytes", f"{2**31}", f"must be a positive power of two up to 1073741824, got {2**31}"),
    ("address_map.base", f"{2**64}", "must be a non-negative integer or a hex string like '0x1000', below 2^64"),
    ("address_map.base", f'"{hex(2**64)}"', "must be a non-negative integer or a hex string like '0x1000', below"),
    ("external_memory.bank_capacity_mb", f"{2**20 + 1}", "must be a positive integer up to 1048576"),
    ("timing.dma_bytes_per_cycle", "Infinity", "must be a finite number of at least 0.001"),
    ("timing.dma_bytes_per_cycle", "NaN", "must be a finite number of at least 0.001"),
    ("name", '"two\\nlines"', "must be a non-empty printable string of at most 100 characters, got 'two\\nlines'"),
    ("name", f'"{"x" * 101}"', "must be a non-empty printable string of at most 100 characters"),
])
def test_values_are_bounded_to_what_the_model_holds(tmp_path, key, raw, reason):
    message = error(tmp_path, "b.json", config_text(".json", key, raw))
    assert message.startswith(f"{key}: {reason}"), message


def test_largest_allowed_values_load(tmp_path):
    document = json.loads(json.dumps(MINIMAL))
    document["timing"].update(dram_latency_cycles=10**6, line_bytes=2**30)
    document["address_map"] = {"top": hex(2**64 - 1), "end": 2**64 - 1}
    path = tmp_path / "max.json"
    path.write_text(json.dumps(document))
    machine = load_machine(path)
    assert (machine.external.latency_cycles, machine.line_bytes) == (10**6, 2**30)


@pytest.mark.parametrize("make, shown", [
    (lambda: 10**5000, "got an integer of 16610 bits"),  # repr would raise, after quadratic work
    (lambda: "x" * 10**7, "got 'xxxxx"),
    (lambda: [[[[[[[1]]]]]]] * 10**6, "got [[[[...]]], [[[...]]],"),
    (lambda: {"k" * 10**6: 1}, "got {'kkkkk"),
], ids=["int", "str", "list", "dict"])
def test_values_in_messages_are_bounded_in_work_and_size(make, shown):
    document = json.loads(json.dumps(MINIMAL))
    document["name"] = make()
    with pytest.raises(ConfigError) as info:
        machine_from_dict(document, "x.json")
    assert shown in str(info.value) and len(str(info.value)) < 200


# --- other hostile input --------------------------------------------------------------------------


def test_python_tags_are_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    message = error(tmp_path, "t.yaml", f'name: !!python/object/apply:os.system ["touch {marker}"]\n')
    assert message.startswith("line 1, column 7: invalid YAML: could not determine a constructor for the tag ")
    assert not marker.exists()


@pytest.mark.parametrize("name, content, expected", [
    ("u.yaml", b"name: caf\xe9\n", "line 1: cannot read: not UTF-8 text"),
    ("u.json", b'{\n"name": "caf\xe9"}', "line 2: cannot read: not UTF-8 text"),
    ("n.yaml", b"name: a\x00b\n", "line 1: invalid YAML: unacceptable character #x0000"),
    ("n.json", b'{"name": "a\x00b"}', "line 1, column 12: invalid JSON: Invalid control character at"),
    ("d.yaml", b"name: a\nname: b\n", "line 2, column 1: invalid YAML: the key 'name' is given twice"),
    ("d.json", b'{"name": "a", "name": "b"}', "must be a mapping, got a mapping with the key 'name' twice"),
    ("c.yaml", b"? [a, b]\n: 1\n", "line 1, column 3: invalid YAML: a key is a name, not a list"),
    ("c.yaml", b"timing:\n  {a: 1}: 2\n", "line 2, column 3: invalid YAML: a key is a name, not a mapping"),
    ("s.yaml", b"42\n", "must be a mapping, got 42"),
    ("l.yaml", b"- 1\n- 2\n", "must be a mapping, got [1, 2]"),
    ("e.yaml", b"", "must be a mapping, got None"),
    ("m.yaml", b"name: a\n---\nname: b\n",
     "line 2, column 1: invalid YAML: expected a single document in the stream, but found another document"),
    ("t.yaml", b"name: 2001-13-45\n", "line 1, column 7: invalid YAML: '2001-13-45' is not a valid timestamp"),
    ("i.yaml", b'name: !!int ""\n', "line 1, column 7: invalid YAML: '' is not a valid int"),
    ("b.yaml", b"name: !!bool maybe\n", "line 1, column 7: invalid YAML: 'maybe' is not a valid bool"),
    ("k.json", b'{"\\u001b[2J": 1}', "'\\x1b[2J': unknown key (expected one of: "),
    ("h.yaml", b"#" * (10 * MAX_CONFIG_BYTES), "320 KB, larger than the 32 KB a config may be"),
])
def test_hostile_file(tmp_path, name, content, expected):
    assert error(tmp_path, name, content).startswith(expected)


def test_duplicate_key_deep_in_json_names_its_mapping(tmp_path):
    text = config_text(".json").replace('"bank_count": 4,', '"bank_count": 4, "bank_count": 8,')
    assert error(tmp_path, "d.json", text) == \
        "on_chip_memory.l2: must be a mapping, got a mapping with the key 'bank_count' twice"


@pytest.mark.parametrize("suffix, value", [(".yaml", ".nan"), (".yaml", ".inf"), (".yaml", "-.inf"),
                                           (".json", "NaN"), (".json", "1e999")])
def test_non_finite_floats_name_their_key(tmp_path, suffix, value):
    message = error(tmp_path, f"f{suffix}", config_text(suffix, "timing.clock_ghz", value))
    assert message.startswith("timing.clock_ghz: must be a number from 0.001 to 1000, got ")


def test_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + (CONFIGS / "minimal.json").read_bytes())
    assert load_machine(path).name == "minimal"


# --- both CLIs --------------------------------------------------------------------------------------


def test_loader_refuses_the_alias_bomb_in_one_line(tmp_path):
    obj = tmp_path / "m.kpu"
    assert run_cli("compiler", ROOT / "examples" / "matmul_256.dfg", "-o", obj).returncode == 0
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(billion_laughs())
    assert_one_line_error(run_cli("loader", obj, "--config", bomb), f"{bomb}: line 1, column 8:",
                          "anchors and aliases are not allowed")


def test_loader_refuses_a_list_as_a_key_in_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("? [a, b]\n: 1\n")
    assert_one_line_error(run_cli("loader", "--show-config", "--config", bad),
                          f"{bad}: line 1, column 3: invalid YAML: a key is a name, not a list")


def test_compiler_refuses_the_alias_bomb_in_one_line(tmp_path):
    bomb, out = tmp_path / "bomb.yaml", tmp_path / "m.kpu"
    bomb.write_text(billion_laughs())
    proc = run_cli("compiler", ROOT / "examples" / "matmul_256.dfg", "--target", bomb, "-o", out)
    assert_one_line_error(proc, f"{bomb}: line 1, column 8:", "anchors and aliases are not allowed")
    assert not out.exists()
