"""Recipes that build and run models for a purpose: the tiny default job, the decoding
benchmarks, the prepared GPU check and the real-size smoke."""
