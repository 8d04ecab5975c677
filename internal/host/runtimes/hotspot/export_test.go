package hotspot

// AttachRetryGap spaces the snapshots TestHostileProcess takes, so that
// each refusal counts.
const AttachRetryGap = attachRetryGap
