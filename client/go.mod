module github.com/quotaplane/quotaplane/client

go 1.23
