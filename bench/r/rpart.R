# recursive partitioning (rpart): classification tree with 5-fold internal cross-validation on a 100,000 x 30 data frame (~24 MB), pruning at the 1-SE cp, and a regression tree on a transformed copy of the frame; exercises model-frame copies, rpart's per-variable sort index and work arrays and copy-on-modify of data-frame columns.
suppressMessages(library(rpart))
set.seed(2513)
n <- 100000
d <- as.data.frame(matrix(rnorm(n * 26), n, 26))
d$store <- factor(sample(paste0("st", 1:12), n, replace = TRUE))
d$month <- factor(month.abb[sample(12, n, replace = TRUE)], levels = month.abb)
d$units <- rpois(n, 5)
d$spend <- 10 + 3 * d$V1 + 2 * (d$V2 > 0) * d$V3 + 1.5 * (d$store %in% c("st2", "st7")) + d$units + rnorm(n, sd = 3)
d$churn <- factor(ifelse(d$spend + rnorm(n, sd = 3) < 14, "yes", "no"))

ct <- rpart(churn ~ . - spend, data = d, method = "class", cp = 0.0005, xval = 5)
cpt <- ct$cptable
best <- which.min(cpt[, "xerror"])
thr <- cpt[best, "xerror"] + cpt[best, "xstd"]
cp1se <- cpt[which(cpt[, "xerror"] <= thr)[1], "CP"]
pt <- prune(ct, cp = cp1se)

d2 <- d
d2$spend <- log(d2$spend - min(d2$spend) + 1)
rt <- rpart(spend ~ . - churn, data = d2, cp = 0.001, xval = 0)
cat(sprintf("class tree: splits %d  pruned leaves %d  cp.1se %.6f  train err %.6f\n", nrow(cpt) - 1,
            sum(pt$frame$var == "<leaf>"), cp1se, mean(predict(pt, d, type = "class") != d$churn)))
cat(sprintf("reg tree: leaves %d  rel error %.6f  top vars %s\n", sum(rt$frame$var == "<leaf>"),
            rt$cptable[nrow(rt$cptable), "rel error"], paste(names(rt$variable.importance)[1:3], collapse = " ")))
