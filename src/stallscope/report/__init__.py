"""Report: one object built from the models and assessments, and one writer per format."""

from stallscope.report.build import SCHEMA_VERSION, Report, build_report

__all__ = ["SCHEMA_VERSION", "Report", "build_report"]
