"""The release stage's extra outputs in one call, for the DAG: PHSafe estimates, certificate (Markdown + HTML),
accuracy report, then the validated manifest last.

Layout under ``runs/{id}/release/``::

    phsafe/estimates/{PH1,PH5,PH8,PH1_num,...}.csv   PHSafe statistical post-processing (pipe-delimited)
    CERTIFICATE.md, CERTIFICATE.html                privacy certificate
    ACCURACY.html                                   accuracy report (plots embedded)
    MANIFEST.json                                   SHA-256 and rows of every file; written last

Everything except the accuracy report of a *test* release is computed from released files, the frozen plan
and public inputs through the post-processing store view (which cannot read ``confidential/``). A test
release's report also compares against the ground-truth twins (:func:`dasflow.release.accuracy.truth_frames`,
test mode only). All outputs are deterministic: re-running gives the same bytes.
"""

from __future__ import annotations

from typing import Any

from dasflow.io.store import sha256_bytes
from dasflow.pipeline.run import RunContext
from dasflow.release.accuracy import accuracy_report, truth_frames
from dasflow.release.certificate import certificate
from dasflow.release.phsafe_estimates import (
    estimate_file_name,
    estimates_bytes,
    phsafe_estimates,
    read_release_frames,
)
from dasflow.release.publish import write_release_manifest

CERTIFICATE_MD = "CERTIFICATE.md"
CERTIFICATE_HTML = "CERTIFICATE.html"
ACCURACY_HTML = "ACCURACY.html"


def _put(ctx: RunContext, rel: str, data: bytes) -> tuple[str, dict[str, Any]]:
    key = f"{ctx.root}/release/{rel}"
    ctx.post_store().put(key, data)
    return key, {"sha256": sha256_bytes(data), "bytes": len(data)}


def write_phsafe_estimates(ctx: RunContext) -> dict[str, dict[str, Any]]:
    """Estimates of every released PHSafe table under ``release/phsafe/estimates/`` (none without PHSafe)."""
    if not any(p.name == "phsafe" for p in ctx.config.products):
        return {}
    frames = read_release_frames(ctx.post_store(), f"{ctx.root}/release/phsafe/")
    out = {}
    for name, frame in sorted(phsafe_estimates(frames).items()):
        key, info = _put(ctx, f"phsafe/{estimate_file_name(name)}", estimates_bytes(frame))
        out[key] = info
    return out


def write_certificate(ctx: RunContext) -> dict[str, dict[str, Any]]:
    """``CERTIFICATE.md`` and ``CERTIFICATE.html``."""
    md, page = certificate(ctx)
    return dict([_put(ctx, CERTIFICATE_MD, md.encode()), _put(ctx, CERTIFICATE_HTML, page.encode())])


def write_accuracy_report(ctx: RunContext, with_truth: bool | None = None) -> dict[str, dict[str, Any]]:
    """``ACCURACY.html``; ``with_truth`` defaults to "test release" (never possible for production)."""
    use_truth = ctx.config.is_test if with_truth is None else with_truth
    page = accuracy_report(ctx, truth_frames(ctx) if use_truth else None)
    return dict([_put(ctx, ACCURACY_HTML, page.encode())])


def finalize_release(ctx: RunContext, *, accuracy_truth: bool | None = None) -> dict[str, Any]:
    """Write the estimates, certificate and accuracy report, then validate and write ``MANIFEST.json`` last.

    Call after the product tables are in ``release/`` (the pipeline's ``release_stage``). Returns the manifest.
    """
    write_phsafe_estimates(ctx)
    write_certificate(ctx)
    write_accuracy_report(ctx, accuracy_truth)
    return write_release_manifest(ctx)
