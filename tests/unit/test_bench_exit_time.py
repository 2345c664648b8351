"""The killed-process exit benchmark (phoenix_hpc/bench/exit_time.py): its input is refused or obeyed, a
child that fails is reported, and one real child is killed and timed."""

import sys

import pytest

from phoenix_hpc.bench import exit_time as E


def test_sizes_are_parsed_or_refused():
    assert E.parse_sizes("100,600") == [100, 600]
    assert E.parse_sizes("100", available_mib=1000) == [100]
    for bad in ("", "0", "10,x", "-5", "1.5", "\u00b2", "1,,2"):
        with pytest.raises(ValueError, match="--mib"):
            E.parse_sizes(bad)
    with pytest.raises(ValueError, match="MemAvailable.*allowed: 1 to 500"):
        E.parse_sizes("600", available_mib=1000)


@pytest.mark.parametrize("argv,field", [(["--mib", "0"], "--mib"), (["--mib", "\u00b2"], "--mib"),
                                        (["--mib", "99999999"], "--mib"), (["--repeat", "0"], "--repeat"),
                                        (["--repeat", "two"], "--repeat"), (["--repeat", "\u00b2"], "--repeat")])
def test_bad_arguments_exit_2_naming_the_option(argv, field, capsys):
    assert E.main(argv) == 2
    err = capsys.readouterr().err
    assert field in err and "allowed" in err and "Traceback" not in err


def test_a_child_that_fails_is_reported_with_its_stderr(tmp_path):
    bad = tmp_path / "python"
    bad.write_text("#!/bin/sh\necho 'no torch here' >&2\nexit 3\n")
    bad.chmod(0o755)
    with pytest.raises(RuntimeError, match="exited with status 3 before it connected.*no torch here"):
        E.kill_to_eof_ms(8, "1", python=str(bad))


def test_one_child_is_killed_and_its_socket_closes():
    ms, rss, huge = E.kill_to_eof_ms(32, "1", python=sys.executable)
    assert 0 < ms < 10_000
    assert rss is not None and rss >= 32  # its tensors are resident
    assert huge is not None and 0 <= huge <= rss
    from phoenix_hpc.slurm.procs import thp_mode

    if thp_mode() in ("madvise", "always"):
        assert huge >= 16, f"{huge} MiB in huge pages for 32 MiB of tensors with THP_MEM_ALLOC_ENABLE=1"
