# glmnet: 5-fold cross-validated lasso logistic regression (cv.glmnet) and an elastic-net gaussian path on a 80,000 x 120 predictor matrix (77 MB); exercises model-matrix construction from a data frame, per-fold row-subset copies of the matrix and Fortran work arrays.
suppressMessages(library(glmnet))
set.seed(2505)
n <- 80000; p <- 120
d <- as.data.frame(matrix(rnorm(n * p), n, p))
b <- c(rnorm(15), rep(0, p - 15))
eta <- drop(as.matrix(d) %*% b)
d$y <- rbinom(n, 1, plogis(eta))
d$z <- eta + rnorm(n)

x <- model.matrix(~ . - y - z, data = d)[, -1]
foldid <- sample(rep(1:5, length.out = n))
cvfit <- cv.glmnet(x, d$y, family = "binomial", foldid = foldid, nlambda = 30, lambda.min.ratio = 0.005)
enet <- glmnet(x, d$z, alpha = 0.5, nlambda = 60)
cb <- as.numeric(coef(cvfit, s = "lambda.1se"))
ce <- as.numeric(coef(enet, s = enet$lambda[30]))
cat(sprintf("cv: lambda.min %.6f lambda.1se %.6f nonzero %d sumcoef %.4f\n",
            cvfit$lambda.min, cvfit$lambda.1se, sum(cb != 0), sum(cb)))
cat(sprintf("enet: df %d sumcoef %.4f dev %.4f\n", enet$df[30], sum(ce), enet$dev.ratio[30]))
