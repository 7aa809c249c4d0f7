"""The release stage's own parts: PHSafe statistical post-processing, the privacy certificate, the accuracy
report, output validation, the release manifest and publication (see ``docs/release.md``).

Pure library code over a ``RunContext`` or over release frames; no Prefect import.
"""
