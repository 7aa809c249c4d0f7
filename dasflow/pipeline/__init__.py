"""The release pipeline as plain functions (no Prefect): validate → preprocess → measure → post-process →
release, each stage idempotent and checkpointed in the store. ``flows/`` and ``tasks/`` wrap these thinly."""
