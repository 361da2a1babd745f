"""A Dataflow job's estimated cost: workers, worker-hours and dollars from the dated price table."""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from recordforge.runners.dataflow_prices import PRICES, PRICES_DATE, cost


def test_a_fixed_worker_count_is_priced_per_worker_hour() -> None:
    options = PipelineOptions(["--machine_type=n1-standard-4", "--num_workers=3", "--region=us-central1"])
    # 4 vCPUs x 1,800 s of work = 7,200 CPU-seconds: half an hour on each vCPU of one machine.
    out = cost(options, rows=7_200_000, seconds_per_row=1e-3, items=100)
    vcpu, memory, disk = PRICES["us-central1"]
    hours = (7_200 / 4 + 3 * 180) / 3600
    assert out["workers"] == 3 and out["machine_type"] == "n1-standard-4"
    assert out["worker_hours"] == pytest.approx(hours, abs=1e-3)
    assert out["cost_usd"] == pytest.approx(hours * (4 * vcpu + 15 * memory + 25 * disk), abs=0.01)
    assert out["prices_date"] == PRICES_DATE and out["prices_source"].startswith("https://")


def test_autoscaling_is_sized_by_the_work_and_bounded_by_the_items_and_the_maximum() -> None:
    many = cost(PipelineOptions([]), rows=10**9, seconds_per_row=1e-5, items=10_000)
    assert many["workers"] == 6  # 10,000 CPU-seconds on 1-vCPU machines, half an hour each
    assert many["machine_type"] == "n1-standard-1"
    few = cost(PipelineOptions(["--max_num_workers=4"]), rows=10**9, seconds_per_row=1e-5, items=10_000)
    assert few["workers"] == 4
    one_item = cost(PipelineOptions([]), rows=10**9, seconds_per_row=1e-5, items=1)
    assert one_item["workers"] == 1


def test_a_region_without_prices_says_so() -> None:
    out = cost(PipelineOptions(["--region=mars-north1"]), rows=1000, seconds_per_row=1e-6, items=1)
    assert out["region"] == "mars-north1 (priced as us-central1)"
