"""mathrl/machine.py: the CPU model, type and flags read from /proc/cpuinfo text written here."""

from __future__ import annotations

import torch

from mathrl.machine import cpu_info, cpu_type, describe_machine, machine_comment

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
processor\t: 1
model name\t: something else
"""
AMD = "model name\t: AMD EPYC 9B14\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"


def test_model_and_flags_from_cpuinfo() -> None:
    assert cpu_info(INTEL) == ("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
                               ["amx_bf16", "amx_tile", "amx_int8", "avx512_bf16", "avx512f", "avx2"])
    assert cpu_info(AMD) == ("AMD EPYC 9B14", ["avx512_bf16", "avx512f", "avx2"])
    assert cpu_info("model name\t: AMD EPYC\n")[1] == []


def test_cpu_type_separates_the_two_families() -> None:
    assert cpu_type(*cpu_info(INTEL)) == "Intel Xeon (AMX)"
    assert cpu_type(*cpu_info(AMD)) == "AMD EPYC"
    assert cpu_type("AMD EPYC", []) == "AMD EPYC"


def test_this_machine_and_its_comment_lines() -> None:
    m = describe_machine()
    assert set(m) == {"cpu_model", "cpu_type", "cpu_flags", "threads", "torch"}
    assert m["threads"] == torch.get_num_threads() and m["torch"] == torch.__version__
    text = machine_comment(m)
    assert [line[:10] for line in text.splitlines()] == ["# machine:", "# threads:"]
    assert m["cpu_type"] in text
