"""One filled-in instance of every event type, as the golden payloads were written from."""

from __future__ import annotations

from datetime import UTC, datetime

from neuron_dra_common.events import (
    AlertStateChanged,
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    ClaimPrepared,
    ClaimUnprepared,
    DeviceHealthChanged,
    DeviceTaint,
    DeviceTaintChanged,
    Event,
    NodeHeartbeat,
    NodeInventory,
    NodeLost,
    NodeRecovered,
    ObjectRef,
    WorkloadStateChanged,
)
from neuron_dra_common.hardware.model import (
    ArchInfo,
    CoreStatus,
    Counter,
    EccCounters,
    NeuronDevice,
    NodeHardware,
    UltraServerInfo,
)

WHEN = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
WORKLOAD = ObjectRef(namespace="ml", name="train", uid="5f0c7e4e-1b9f-4a57-9d4c-3f1f5e0c2a11")
CLAIM = ObjectRef(namespace="ml", name="train-0-neuron", uid="0b7a2c3d-8e1f-4f5a-9b6c-7d8e9f0a1b2c")


def samples() -> list[Event]:
    device = NeuronDevice(
        index=0,
        physical_cores=8,
        logical_cores=4,
        memory_bytes=96 * 2**30,
        connected_devices=(3, 1, 4, 12),
        serial_number="0123456789ABCDEF",
        arch=ArchInfo(arch_type="NDv3", instance_type="Trn2", device_name="Trainium2"),
        bdf="0000:cc:00.0",
        numa_node=0,
        cpu_affinity="0-47",
        ecc=EccCounters(mem_uncorrected=Counter(total=0, present=0)),
        cores=(CoreStatus(index=0, counters={"exec_bad_input": Counter(total=1, present=0)}),),
    )
    return [
        NodeInventory(
            node="ip-10-0-0-1.ec2.internal",
            boot_id="8c1e5b7a",
            generation=3,
            hardware=NodeHardware(
                instance_type="trn2u.48xlarge",
                driver_version="2.24.7.0",
                default_lnc=2,
                devices=(device,),
                ultraserver=UltraServerInfo(
                    server_id_4="0a1b2c3d4e5f6071", node_id_4=2, supported_modes=(1, 2, 3, 4)
                ),
            ),
            dra_driver_version="0.1.0",
            observed_at=WHEN,
        ),
        NodeHeartbeat(
            node="ip-10-0-0-1.ec2.internal", boot_id="8c1e5b7a", sequence=42, sent_at=WHEN
        ),
        DeviceHealthChanged(
            node="ip-10-0-0-1.ec2.internal",
            device="neurondevice3",
            health="Unhealthy",
            previous="Healthy",
            reason="uncorrectable memory error",
            error_code="mem_uncorrected",
            observed_at=WHEN,
        ),
        AllocationRequested(
            request_id="req-1", workload=WORKLOAD, topology_size=4, instance_type="trn2u.48xlarge"
        ),
        AllocationDecided(
            request_id="req-1",
            workload=WORKLOAD,
            granted=True,
            ultraservers=("us-0a1b2c3d4e5f6071",),
            nodes=("ip-10-0-0-1.ec2.internal", "ip-10-0-0-2.ec2.internal"),
        ),
        AllocationReleased(
            request_id="release-1",
            workload=WORKLOAD,
            ultraservers=("us-0a1b2c3d4e5f6071",),
            nodes=("ip-10-0-0-1.ec2.internal", "ip-10-0-0-2.ec2.internal"),
        ),
        ClaimPrepared(
            node="ip-10-0-0-1.ec2.internal",
            claim=CLAIM,
            devices=("neurondevice0", "neurondevice1"),
            cdi_devices=("neuron.aws.com/neuron=neurondevice0",),
            workload_id="ml.train",
        ),
        ClaimUnprepared(node="ip-10-0-0-1.ec2.internal", claim=CLAIM, devices=("neurondevice0",)),
        WorkloadStateChanged(workload=WORKLOAD, state="Running", previous="Pending"),
        NodeLost(
            node="ip-10-0-0-1.ec2.internal",
            last_heartbeat_at=datetime(2026, 3, 1, 11, 59, 58, tzinfo=UTC),
            detected_at=datetime(2026, 3, 1, 12, 0, 1, tzinfo=UTC),
            reason="no heartbeat for 3.0 s",
        ),
        NodeRecovered(
            node="ip-10-0-0-1.ec2.internal",
            detected_at=datetime(2026, 3, 1, 12, 5, 0, tzinfo=UTC),
            lost_for_seconds=299.0,
        ),
        DeviceTaintChanged(
            node="ip-10-0-0-1.ec2.internal",
            device="neurondevice3",
            taints=(
                DeviceTaint(
                    key="neuron.aws.com/hardware-error",
                    value="SRAM_UNCORRECTABLE_ERROR",
                    effect="NoExecute",
                ),
            ),
            previous=(
                DeviceTaint(
                    key="neuron.aws.com/hardware-error",
                    value="HBM_REPAIRABLE_ERROR",
                    effect="NoSchedule",
                ),
            ),
            reason="SRAM_UNCORRECTABLE_ERROR uncorrectable, action replace-instance",
            pool_generation=7,
            changed_at=datetime(2026, 3, 1, 12, 0, 2, tzinfo=UTC),
        ),
        AlertStateChanged(
            key="NeuronDeviceUnhealthy/ip-10-0-0-1.ec2.internal/neurondevice3",
            alertname="NeuronDeviceUnhealthy",
            status="firing",
            labels={
                "alertname": "NeuronDeviceUnhealthy",
                "severity": "critical",
                "node": "ip-10-0-0-1.ec2.internal",
                "device": "neurondevice3",
            },
            annotations={"summary": "neurondevice3 on ip-10-0-0-1.ec2.internal is unhealthy"},
            starts_at=datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC),
            cause_sequence=42,
            cause_id="9f0c1d2e3a4b5c6d7e8f901234567890",
        ),
    ]
