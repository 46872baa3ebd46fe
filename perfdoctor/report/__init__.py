"""Renderers: they only format a ReportDoc (see document.py); no analysis happens here."""
