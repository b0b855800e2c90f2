"""The read side of the lake: several mirrors at one source position (`consistent`), through the
changelog each mirror plus its tail (`through_changelog`, `changelog_tail`), what a read returns
(`result`) and the read as SQL views (`views`). It stands with the jobs, above `merging`, whose
decoding a changelog tail reuses (`TableMerger`)."""
