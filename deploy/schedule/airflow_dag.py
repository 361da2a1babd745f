"""A daily RecordForge build in Airflow, with the Apache Beam provider's operator.

Copy next to your DAGs; it runs main.py (the same entry point as the Flex Template) on Dataflow.
"""

from __future__ import annotations

import datetime

from airflow import DAG
from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator

with DAG(
    dag_id="recordforge_daily",
    schedule="0 3 * * *",
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
) as dag:
    BeamRunPythonPipelineOperator(
        task_id="convert",
        py_file="gs://MY_BUCKET/recordforge/main.py",
        runner="DataflowRunner",
        pipeline_options={
            "source": "gs://MY_BUCKET/logs/{YYYY}/{MM}/{DD}/*.parquet",
            "output": "gs://MY_BUCKET/tfrecords/logs/{YYYY}{MM}{DD}",
            "schema": "gs://MY_BUCKET/schemas/logs.yaml",
            "span": "latest",
            "if_changed": "true",
            "temp_location": "gs://MY_PROJECT-dataflow/tmp",
            "sdk_container_image": "us-central1-docker.pkg.dev/MY_PROJECT/recordforge/recordforge:0.1.0",
            "sdk_location": "container",
        },
        py_requirements=["recordforge"],
        py_system_site_packages=False,
    )
