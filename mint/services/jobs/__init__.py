"""Fine-tuning jobs: the API side (`fine_tuning`: create, get, list, cancel; with the request's
`checks` and `plans`, and `views`), the worker side (`runner`, the entry, over `claims`,
`training`, `checkpoints`, `versions`, `usage`, `capacity` and `endings`), what both share
(`context`, `events`, `messages`), and replay of a job on new data."""
