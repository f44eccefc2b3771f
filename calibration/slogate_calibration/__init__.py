"""Measure a live llama-server and turn the measurement into a calibration profile."""
