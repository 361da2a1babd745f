#!/usr/bin/env bash
# A daily RecordForge build: Cloud Scheduler calls the Flex Template launch API at 03:00 UTC with
# launch_body.json. `--span latest --if_changed` make a re-run on an unchanged day a no-op.
set -euo pipefail
PROJECT=${PROJECT:?set PROJECT}
REGION=${REGION:-us-central1}
SERVICE_ACCOUNT=${SERVICE_ACCOUNT:-recordforge@${PROJECT}.iam.gserviceaccount.com}
here=$(dirname "$0")

gcloud scheduler jobs create http recordforge-daily \
  --project "$PROJECT" --location "$REGION" \
  --schedule "0 3 * * *" --time-zone "Etc/UTC" \
  --http-method POST \
  --uri "https://dataflow.googleapis.com/v1b3/projects/${PROJECT}/locations/${REGION}/flexTemplates:launch" \
  --headers "Content-Type=application/json" \
  --oauth-service-account-email "$SERVICE_ACCOUNT" \
  --message-body-from-file "$here/launch_body.json"
