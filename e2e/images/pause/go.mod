module llmop.dev/e2e/images/pause

go 1.22
