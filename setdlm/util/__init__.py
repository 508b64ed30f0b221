"""Infrastructure every part uses: input errors, durable writes, git, the data directory,
progress bars, the shared setting rules, the batch-scheduler job, the offline Hub."""
