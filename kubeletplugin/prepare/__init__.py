"""Prepare and unprepare of claims for kubelet: the state module (:mod:`.state`), reading
claims (:mod:`.claims`), turning allocation results into shares (:mod:`.shares`), the crash-safe
checkpoint (:mod:`.checkpoint`), CDI spec files (:mod:`.cdi`) and metrics (:mod:`.metrics`)."""
