"""The result record, in one place: each part a typed value that writes and reads its own JSON
(checked field by field as it reads it: :mod:`autoprec.core.fields`), which the measurement, the
study and the search build and every view, verb and export reads. Its modules: what a measurement
and a trial are (trial), what the timing and the checks decided (verdict), what the search did and
ships (facts), what it says per unit (per_unit), and the result files made of them (documents)."""
