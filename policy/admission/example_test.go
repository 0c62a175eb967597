package admission_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"regexp"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/policy/admission"
)

// A Reviewer turns an AdmissionRequest into an AdmissionResponse with the
// same policy bundle the nodes use. Here: an untrusted tenant's pod that
// asks for runc.
func ExampleReviewer() {
	engine, err := policy.Open(context.Background(), policy.Options{
		BundlePath:               "../../rego",
		DataPath:                 "testdata/tenants.json",
		InsecureSkipVerification: true, // tests only: deploy/ verifies a signed bundle
	})
	if err != nil {
		log.Fatal(err)
	}
	defer engine.Close()
	reviewer, err := admission.NewReviewer(admission.Options{Decider: engine})
	if err != nil {
		log.Fatal(err)
	}

	body, err := os.ReadFile("testdata/pod-runc.json")
	if err != nil {
		log.Fatal(err)
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		log.Fatal(err)
	}
	resp := reviewer.Review(context.Background(), review.Request)
	rules := regexp.MustCompile(`\[[a-z_.]+\]`).FindAllString(resp.Result.Message, -1)
	fmt.Println(resp.UID == review.Request.UID, resp.Allowed, resp.Result.Code, rules)
	// Output: true false 403 [[runtime.runc_forbidden]]
}
