"""experiments/dram_traffic.py on CPU: ncu's CSV read into kernel rows, the table's sums and
rates, the ncu command, and one line where ncu is missing."""

import pytest

from experiments import dram_traffic

# ncu --csv --print-units base: notes before the header, one row per kernel and metric
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')


def ncu_row(launch, kernel, metric, unit, value):
    fields = [launch, "123", "python3", "h", kernel, "1", "7", "(128, 1, 1)", "(64, 1, 1)",
              "0", "9.0", "Command line profiler metrics", metric, unit, value]
    return ",".join(f'"{x}"' for x in fields)


NCU_OUTPUT = "\n".join(
    ["==PROF== Connected to process 123", '==PROF== Profiling "kernel_a": 1 pass', HEADER]
    + [ncu_row("0", "kernel_a", *m) for m in (
        ("dram__bytes_read.sum", "byte", "1,000,000,000"),
        ("dram__bytes_write.sum", "byte", "500,000,000"),
        ("gpu__time_duration.sum", "nsecond", "500,000"))]
    + [ncu_row("1", "fusion_b", *m) for m in (
        ("dram__bytes_read.sum", "byte", "2000"), ("dram__bytes_write.sum", "byte", "0"),
        ("gpu__time_duration.sum", "nsecond", "1000"))]) + "\n"


def test_kernel_rows_and_table():
    rows = dram_traffic.kernel_rows(NCU_OUTPUT)
    assert rows == [{"kernel": "kernel_a", "read": 1e9, "written": 5e8, "ns": 5e5},
                    {"kernel": "fusion_b", "read": 2000.0, "written": 0.0, "ns": 1000.0}]
    assert dram_traffic.rate(rows[0]) == pytest.approx(3.0)  # 1.5 GB in 0.5 ms
    table = dram_traffic.markdown(rows, "header")
    assert "| kernel_a | 1000.0 | 500.0 | 500.0 | 3.00 |" in table
    assert "| all 2 kernels | 1000.0 | 500.0 | 501.0 |" in table
    assert dram_traffic.kernel_rows("no csv here\n") == []


def test_ncu_command_runs_the_child_with_the_args():
    args = dram_traffic.argparse.Namespace(op="pallas_lion_2pass", length=4096, dim=64,
                                           kind="fwd+bwd", batch=2, heads=8)
    cmd = dram_traffic.ncu_command(args)
    assert cmd[0] == "ncu" and "--profile-from-start" in cmd and "off" in cmd
    assert ",".join(dram_traffic.METRICS) in cmd
    tail = cmd[cmd.index("experiments.dram_traffic") + 1:]
    assert tail == ["--child", "--op", "pallas_lion_2pass", "--length", "4096", "--dim", "64",
                    "--pass", "fwd+bwd", "--batch", "2", "--heads", "8"]


def test_without_ncu_one_line(monkeypatch, capsys):
    monkeypatch.setattr(dram_traffic.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit):
        dram_traffic.main(["--op", "pallas_causal_2pass"])
    err = capsys.readouterr().err.strip().splitlines()
    assert "ncu (Nsight Compute) not found" in err[-1]
