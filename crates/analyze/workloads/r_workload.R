# An R session holding a data set and the copies R's copy-on-modify makes
# during a typical analysis. Prints its PID, then sleeps until killed.
# Used by docs/ANALYSIS.md: `Rscript r_workload.R [ROWS]`.
n <- suppressWarnings(as.integer(commandArgs(TRUE)[1]))
if (is.na(n)) n <- 10000000L
set.seed(1)
df <- data.frame(id = seq_len(n),
                 age = sample(18:90, n, replace = TRUE),
                 income = rlnorm(n, 10, 1),
                 region = factor(sample(letters[1:10], n, replace = TRUE)))
adjusted <- df                                  # shares columns ...
idx <- seq(1, n, by = 4096)
adjusted$income[idx] <- adjusted$income[idx] * 1.01   # ... until one is modified
by_income <- df[order(df$income), ]             # a reordered copy
counts <- table(df$region)
scratch <- matrix(0, 2000, 2000)                # 32 MB of zeros
invisible(gc())
cat(Sys.getpid(), "\n")
flush(stdout())
Sys.sleep(3600)
