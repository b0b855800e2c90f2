"""The pipeline's operating policy, apart from the Dagster definitions that apply it: what a slot's
health is (`slot_health`), what the supervisor does about a worker (`supervision`), when an incident
opens, repeats and resolves (`incidents`), what each page says (`pages`, with the lake's watermark
in `lake_watermark`), how an alert is rendered (`alerts`) and where its links go (`links`).

Pure: no Dagster, no I/O; the sensors pass in what they observed, and tests feed it values.
"""
