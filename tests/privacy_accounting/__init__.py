"""Tests of dasflow.privacy.accounting: the papers' privacy numbers, exact parsing, composition."""
