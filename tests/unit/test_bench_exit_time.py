"""The killed-process exit benchmark (phoenix_hpc/bench/exit_time.py): its input is refused or obeyed, and
one real child is killed and timed."""

import pytest

from phoenix_hpc.bench import exit_time as E


def test_sizes_are_parsed_or_refused():
    assert E.parse_sizes("100,600") == [100, 600]
    for bad in ("", "0", "10,x", "-5", "1.5"):
        with pytest.raises(ValueError, match="--mib"):
            E.parse_sizes(bad)


@pytest.mark.parametrize("argv,field", [(["--mib", "0"], "--mib"), (["--repeat", "0"], "--repeat"),
                                        (["--repeat", "two"], "--repeat")])
def test_bad_arguments_exit_2_naming_the_option(argv, field, capsys):
    assert E.main(argv) == 2
    err = capsys.readouterr().err
    assert field in err and "allowed" in err and "Traceback" not in err


def test_one_child_is_killed_and_its_socket_closes():
    ms, rss, huge = E.kill_to_eof_ms(32, "1")
    assert ms > 0
    assert rss is not None and rss >= 32  # its tensors are resident
    assert huge is not None and 0 <= huge <= rss
