"""experiments.dlog_decay_forms: its table at a small size (both emulated forms and the kernel
in the Pallas interpreter), and its bad arguments."""

import pytest

from experiments import dlog_decay_forms


def test_table_at_a_small_size(capsys):
    dlog_decay_forms.main(["--length", "128", "--dims", "16,24", "--seeds", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| U[")]
    assert len(rows) == len(dlog_decay_forms.CASES)
    for row in rows:
        scans, chunks, kernel = (float(x) for x in row.strip("| ").split(" | ")[2:])
        # the kernel computes the chunks' form: both within the bf16 bound, and close
        assert chunks < 5e-3 and kernel < 5e-3 and abs(kernel - chunks) < 1e-3
        assert scans > 0


@pytest.mark.parametrize("args,message", [(["--dims", "32"], "--dims takes K,V"),
                                          (["--length", "100"], "multiple of 64")])
def test_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit):
        dlog_decay_forms.main(args)
    assert message in capsys.readouterr().err
