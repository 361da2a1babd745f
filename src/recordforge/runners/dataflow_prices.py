"""What a Dataflow batch job of a conversion would cost, from a dated table of list prices."""

from __future__ import annotations

import math
from typing import Any

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, WorkerOptions

__all__ = ["PRICES", "PRICES_DATE", "PRICES_SOURCE", "cost"]

# Dataflow batch list prices (USD) per vCPU-hour, GB-hour of memory and GB-hour of standard
# persistent disk, as Google's page gave them on the date below. Prices change: update the table
# and its date together (no network is reached at run time to look them up).
PRICES_DATE = "2024-06-01"
PRICES_SOURCE = "https://cloud.google.com/dataflow/pricing"
PRICES: dict[str, tuple[float, float, float]] = {
    "us-central1": (0.056, 0.003557, 0.000054),
    "us-east1": (0.056, 0.003557, 0.000054),
    "us-west1": (0.056, 0.003557, 0.000054),
    "europe-west1": (0.0615, 0.003907, 0.00006),
    "europe-west4": (0.0615, 0.003907, 0.00006),
    "asia-east1": (0.0645, 0.004098, 0.000059),
}
# vCPUs and GB of memory per machine of a family, per vCPU (n1-standard-4: 4 vCPUs, 15 GB).
_MEMORY_PER_VCPU = {
    "n1-standard": 3.75,
    "n1-highmem": 6.5,
    "n1-highcpu": 0.9,
    "n2-standard": 4.0,
    "n2-highmem": 8.0,
    "n2-highcpu": 1.0,
    "e2-standard": 4.0,
    "e2-highmem": 8.0,
    "c2-standard": 4.0,
    "n2d-standard": 4.0,
}
_DEFAULT_MACHINE = "n1-standard-1"  # Dataflow's default for a batch worker
_DISK_GB = 25  # a batch worker's boot disk with Dataflow Shuffle (the default for batch)
_START_SECONDS = 180  # a worker VM's start, paid for each worker
_TARGET_WORKER_SECONDS = 1800  # autoscaling is sized here for about half an hour of work


def _machine(name: str) -> tuple[int, float]:
    family, _, size = name.rpartition("-")
    vcpus = int(size) if size.isdigit() else 1
    return vcpus, vcpus * _MEMORY_PER_VCPU.get(family, 3.75)


def cost(
    options: PipelineOptions, *, rows: int | None, seconds_per_row: float | None, items: int | None
) -> dict[str, Any]:
    """Workers, worker-hours and an estimated cost for a job converting `rows` at
    `seconds_per_row` (one core, measured here: a Dataflow vCPU is taken as this machine's core)."""
    worker = options.view_as(WorkerOptions)
    region = options.view_as(GoogleCloudOptions).region or "us-central1"
    machine = worker.machine_type or _DEFAULT_MACHINE
    vcpus, memory = _machine(machine)
    cpu_seconds = (rows or 0) * (seconds_per_row or 0.0)
    if worker.num_workers:
        workers = worker.num_workers
    else:
        wanted = math.ceil(cpu_seconds / vcpus / _TARGET_WORKER_SECONDS) or 1
        workers = min(wanted, worker.max_num_workers or 1000, max(1, items or 1))
    hours = (cpu_seconds / vcpus + workers * _START_SECONDS) / 3600
    known = region in PRICES
    vcpu_price, memory_price, disk_price = PRICES.get(region, PRICES["us-central1"])
    per_worker_hour = vcpus * vcpu_price + memory * memory_price + _DISK_GB * disk_price
    return {
        "workers": workers,
        "machine_type": machine,
        "worker_hours": round(hours, 3),
        "cost_usd": round(hours * per_worker_hour, 2),
        "region": region if known else f"{region} (priced as us-central1)",
        "prices_date": PRICES_DATE,
        "prices_source": PRICES_SOURCE,
    }
