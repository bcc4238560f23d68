"""bench.common's machine description: whether the CPU has VNNI, read from /proc/cpuinfo's flags."""

import pytest

from bench import common


@pytest.mark.parametrize('text, expected', [
    ('model name\t: Xeon\nflags\t\t: fpu avx2 avx512f avx512bw avx512_vnni\n', True),
    ('flags\t\t: fpu avx2 avx_vnni\n', True),  # the AVX2-width VNNI of newer client CPUs
    ('model name\t: Xeon\nflags\t\t: fpu avx2 avx512f avx512bw avx512vl\n', False),
    ('processor\t: 0\nFeatures\t: fp asimd asimddp\n', None),  # an Arm CPU lists Features, not flags
])
def test_vnni_is_read_from_the_cpus_flags(tmp_path, text, expected):
  path = tmp_path / 'cpuinfo'
  path.write_text(text, encoding='utf-8')
  assert common.cpu_has_vnni(str(path)) is expected


def test_no_cpuinfo_is_unknown_not_false(tmp_path):
  assert common.cpu_has_vnni(str(tmp_path / 'missing')) is None
