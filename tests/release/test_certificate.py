"""The privacy certificate (issue 12 item 2): universe, every product/level/key with mechanism, sensitivity,
budget and noise scale, totals in ρ and (ε, δ = 1e-10) by the accounting module's conversions, invariants, RNG
mode, code version, config and input SHA-256; a test release says so on its first line."""

from __future__ import annotations

import hashlib
import html.parser
from pathlib import Path

import pytest

from dasflow.pipeline.run import code_version
from dasflow.privacy import accounting
from dasflow.products.plugin import ProductPlugin
from dasflow.registry import get_plugin
from dasflow.release.certificate import TEST_BANNER, certificate
from tests.release.helpers import released_context


class _Text(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.title = ""
        self.text: list[str] = []
        self._in_title = False
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in_title = tag == "title"

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif data.strip() and "style" not in self.tags[-1:]:
            self.text.append(data.strip())


def test_test_release_certificate_contents(tmp_path: Path) -> None:
    ctx = released_context(tmp_path)
    md, page = certificate(ctx)
    assert md.splitlines()[0] == f"**{TEST_BANNER}**"
    assert "seeded test generator (seed 11) — TEST mode" in md
    assert "universe: US" in md
    assert f"`{code_version()}`" in md
    assert f"frozen config SHA-256: `{ctx.config_sha256}`" in md
    # every planned key with its exact budget, sensitivity and noise scale σ² = Δ²/(2ρ)
    assert "| counts/state | state | zcdp | discrete_gaussian | Δ₂² = 1 | 1/2 | σ² = 1 ≈ 1 | 1 | 4 |" in md
    assert "| counts/state_sex | state_sex | zcdp | discrete_gaussian | Δ₂² = 1 | 1/4 | σ² = 2 ≈ 2 | 2 | 8 |" in md
    assert "| state | 1 | discrete_gaussian | 1/2 |  | 4 |" in md  # per-level summary
    # totals: exact ρ and the accounting module's conversions at δ = 1e-10
    assert "total ρ (zCDP) = 3/4" in md
    best = accounting.zcdp_to_approx_dp("3/4", accounting.DELTA)
    assert f"ε at δ = 1e-10: {best.epsilon:.6f} — {best.method} (smallest)" in md
    assert "over 2 of 2 planned keys" in md
    # product configs hashed; the confidential input never (its digest would be a disclosure)
    persons = ctx.store.get("confidential/counts/persons.csv")
    assert hashlib.sha256(persons).hexdigest() not in md
    assert "confidential/counts/persons.csv" not in md
    text = ctx.config.products[0].config_text.encode()
    assert hashlib.sha256(text).hexdigest() in md
    for line in get_plugin("counts").invariants({}, None):  # what the product's plugin declares
        assert f"- {line}" in md
    # a product that declares nothing is listed as such (the plugin default)
    assert ProductPlugin.invariants(get_plugin("counts"), {}, None) == \
        ["counts: not declared by the product (treat as none)"]
    # HTML: same content, test notice first, self-contained (no external resources)
    parser = _Text()
    parser.feed(page)
    assert parser.title.startswith("TEST RELEASE")
    assert parser.text[0] == TEST_BANNER
    assert any(t.startswith("total ρ (zCDP) = 3/4") for t in parser.text)
    assert "http://" not in page and "https://" not in page and "<script" not in page
    # pure function of the frozen release: same bytes twice
    assert certificate(ctx) == (md, page)


def test_production_release_certificate_and_declared_invariants(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = released_context(tmp_path, seed=None)
    monkeypatch.setattr(type(get_plugin("counts")), "invariants",
                        lambda self, public, config: ["counts: the number of states (public)"])
    md, page = certificate(ctx)
    assert md.startswith("# Privacy certificate: release `r1`")
    assert "TEST RELEASE" not in md and "TEST RELEASE" not in page
    assert "CSPRNG: OpenSSL CTR_DRBG (AES-256), seeded by the OS — production mode" in md
    assert "- counts: the number of states (public)" in md


def test_pure_dp_plan_reports_epsilon_and_rdp_conversion() -> None:
    """All-pure plans: ε adds exactly; the (ε, δ) lines come from accounting.compose (incl. the RDP grid)."""
    from dasflow.release.certificate import _total, _total_lines
    entries = [{"product": "p", "key": f"p/{i}", "level": "l", "privacy_defn": "puredp",
                "mechanism": "geometric", "budget": "1/2", "sensitivity": "1", "noise": "2", "cells": 1,
                "variance": "0.5"} for i in range(2)]
    lines = _total_lines(_total(entries))
    assert "total ε (pure DP, sequential composition) = 1" in lines
    assert lines[0] == "total ρ (zCDP) = 1/4 ≈ 0.25"  # ε²/2 per entry
    assert any("puredp" in line for line in lines)
