"""Running the plan: jobs (a file, or a TokenSpeed rank's files) read, transformed and
serialised in worker processes, and their pieces streamed into the output in order."""
