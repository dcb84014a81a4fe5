from sandwich.types import (
    ComputeSlice,
    KernelSchedule,
    MicroKernel,
    Polymerization,
    ProcessPlan,
    ServiceConfig,
    TuneRecord,
)


def _sched(b_k=256):
    return KernelSchedule(MicroKernel(4, 64), ComputeSlice(16, 256, b_k), Polymerization(1, 2, 1), 64)


def test_schedule_json_roundtrip_and_keys():
    s = _sched()
    assert KernelSchedule.from_json(s.to_json()) == s
    assert s.key() != _sched(128).key()
    # slices share one compiled family
    assert s.family_key() == _sched(128).family_key()
    assert s.family() == _sched(128).family()


def test_record_and_service_config_roundtrip():
    r = TuneRecord("fp", "qkv", 2304, 768, "float32", 1, 7, _sched(), 123.4, 10, 1.5)
    assert TuneRecord.from_json(r.to_json()) == r
    c = ServiceConfig("decode", (ProcessPlan((0, 1), 0), ProcessPlan((2, 3), 1)), 2)
    back = ServiceConfig.from_json(c.to_json())
    assert back == c and back.tp == 2
