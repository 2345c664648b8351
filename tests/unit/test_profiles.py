"""Site profiles: the built-in ones load, a user's file loads by path or from $PHOENIX_SITE_PATH, bad files
are rejected with the field named."""

from __future__ import annotations

import pytest

from phoenix_hpc.errors import ProfileError
from phoenix_hpc.profiles import available_sites, load_profile
from phoenix_hpc.profiles.slurm_time import format_slurm_time, parse_slurm_time

MINIMAL = """
name: mysite
node: {gpus_per_node: 8, cores_per_node: 96}
launcher: {srun_mpi: pmix}
"""


def test_builtin_sites_load_with_documented_hardware():
    assert {"local", "perlmutter", "vista"} <= set(available_sites())
    pm = load_profile("perlmutter")
    assert (pm.node.gpus_per_node, pm.node.cores_per_node, pm.node.nics) == (4, 64, 4)
    assert pm.scheduler.constraint == "gpu" and pm.launcher.srun_mpi == "cray_shasta"
    assert pm.environment.env["NCCL_SOCKET_IFNAME"] == "hsn"
    assert pm.scheduler.qos_limits["debug"].max_time_s == 1800
    vi = load_profile("vista")
    assert vi.node.gpus_per_node == 1 and vi.scheduler.partition == "gh"
    assert not vi.scheduler.allow_node_pinning and not vi.scheduler.request_gpus and not vi.scheduler.request_mem
    assert set(vi.scheduler.partition_limits) == {"gh", "gh-dev"}
    lo = load_profile("local")
    assert lo.node.gpus_per_node == 1 and lo.launcher.srun_mpi == "pmix" and lo.scheduler.limits.max_nodes == 6


def test_builtin_profiles_mark_documented_and_assumed_values():
    from phoenix_hpc.profiles.load import BUILTIN_SITES_DIR

    for name in ("perlmutter", "vista"):
        text = (BUILTIN_SITES_DIR / f"{name}.yaml").read_text()
        assert "[doc]" in text and "[asm]" in text


def test_user_profile_by_path_and_by_search_path(tmp_path):
    f = tmp_path / "mysite.yaml"
    f.write_text(MINIMAL)
    assert load_profile(str(f)).node.gpus_per_node == 8
    p = load_profile("mysite", environ={"PHOENIX_SITE_PATH": str(tmp_path)})
    assert p.name == "mysite" and p.failure_domains.levels == ["node"]
    assert "mysite" in available_sites({"PHOENIX_SITE_PATH": str(tmp_path)})


def test_unknown_site_lists_known_ones():
    with pytest.raises(ProfileError, match=r"unknown site 'nosuch'.*perlmutter"):
        load_profile("nosuch")
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile("./nosuch.yaml")


@pytest.mark.parametrize(
    "text, field",
    [
        ("name: x\nnode: {gpus_per_node: 0, cores_per_node: 4}\nlauncher: {srun_mpi: pmix}\n", "node.gpus_per_node"),
        ("name: x\nnode: {gpus_per_node: 1, cores_per_node: 4}\n", "launcher"),
        (MINIMAL + "scheduler: {qos_limits: {debug: {max_time: soon}}}\n", "scheduler.qos_limits.debug.max_time"),
        (MINIMAL + "environment: {env: {'bad name': x}}\n", "environment.env"),
        (MINIMAL + "scheduler: {qos: 'a b'}\n", "scheduler.qos"),
        (MINIMAL + "failure_domains: {levels: [switch, node]}\n", "failure_domains"),
        (MINIMAL + "failure_domains: {levels: [node, switch], source: rule}\n", "failure_domains"),
        (MINIMAL + "bogus: 1\n", "bogus"),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_profiles_name_the_field(tmp_path, text, field):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ProfileError) as ei:
        load_profile(str(f))
    assert field in str(ei.value)


def test_rule_profile_validates_regex_and_blocks(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text(MINIMAL + "failure_domains:\n  levels: [node, switch]\n  source: rule\n"
                 "  rule: {regex: '^nid(?P<index>\\d+)$', blocks: {switch: 16}}\n")
    assert load_profile(str(f)).failure_domains.rule.blocks == {"switch": 16}


@pytest.mark.parametrize(
    "text, seconds",
    [("30", 1800), ("5:30", 330), ("01:00:00", 3600), ("2-00", 172800), ("1-02:03", 93780), ("1-00:00:01", 86401)],
)
def test_slurm_time_forms(text, seconds):
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "1:2:3:4", "0", "-5", "UNLIMITED"])
def test_slurm_time_rejects(text):
    with pytest.raises(ValueError):
        parse_slurm_time(text)


def test_format_slurm_time():
    assert format_slurm_time(1800) == "00:30:00" and format_slurm_time(93784) == "1-02:03:04"


@pytest.mark.parametrize("extra, field", [
    ("mttf_h: -5", "node.mttf_h"),
    ("mttf_h: 0", "node.mttf_h"),
    ("mttf_source: guessed", "node.mttf_source"),
    ("host_reserved_gb: -1", "node.host_reserved_gb"),
    ("host_per_rank_gb: -0.5", "node.host_per_rank_gb"),
])
def test_bad_node_reliability_and_headroom_fields(tmp_path, extra, field):
    f = tmp_path / "bad.yaml"
    f.write_text(f"name: x\nnode: {{gpus_per_node: 1, cores_per_node: 4, {extra}}}\nlauncher: {{srun_mpi: pmix}}\n")
    with pytest.raises(ProfileError) as ei:
        load_profile(str(f))
    assert field in str(ei.value)


def test_builtin_gpu_sites_state_node_mttf_as_assumption():
    for name in ("perlmutter", "vista"):
        node = load_profile(name).node
        assert node.mttf_h > 0 and node.mttf_source == "assumption" and node.mem_gb
    assert load_profile("local").node.mttf_h is None
