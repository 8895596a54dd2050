# random forest (randomForest): classification forest of 25 trees on a 40,000 x 30 data frame (~10 MB) via the formula interface with out-of-bag error and variable importance, then predict() on a 40,000-row test frame; exercises model-frame and data.matrix copies, per-tree bootstrap index/work vectors and the large forest arrays (nodes x trees) kept in the fitted object.
suppressMessages(library(randomForest))
set.seed(2512)
mk <- function(n) {
  d <- as.data.frame(matrix(rnorm(n * 28), n, 28))
  d$site <- factor(sample(paste0("s", 1:8), n, replace = TRUE))
  d$age <- sample(18:90, n, replace = TRUE)
  eta <- d$V1 + d$V2 * d$V3 - 0.02 * (d$age - 50) + (d$site %in% c("s1", "s4")) + rnorm(n)
  d$outcome <- factor(ifelse(eta > 0.5, "case", "control"))
  d
}
train <- mk(40000)
test <- mk(40000)
rf <- randomForest(outcome ~ ., data = train, ntree = 25, importance = TRUE)
pr <- predict(rf, test)
imp <- importance(rf, type = 1)
cat(sprintf("oob error %.6f  test acc %.6f  mean nodes %.2f\n", rf$err.rate[25, "OOB"], mean(pr == test$outcome), mean(treesize(rf))))
cat(sprintf("top importance %s  %.6f\n", paste(rownames(imp)[order(-imp[, 1])][1:3], collapse = " "), max(imp[, 1])))
